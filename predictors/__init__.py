"""predictors package."""
