"""The view compiler's passes, one module each, in the order ``cumulus.compiler`` runs them."""
