"""prediction_server package."""
