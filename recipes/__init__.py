"""Recipes: one module per model, each runnable with ``python -m recipes.NAME``."""
