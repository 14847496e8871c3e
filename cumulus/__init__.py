"""The view compiler, query layer and Spark layer (views arrive with the next issues)."""
