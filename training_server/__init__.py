"""training_server package."""
