"""M3: DBToaster's map maintenance programs, compiled from view plans by recursive delta
compilation (seed 003 §3), printed and parsed in DBToaster's text syntax, and run by a
sequential reference interpreter (the oracle of the distributed runtime)."""
