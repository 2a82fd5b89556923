"""Screens: the main one (views, workers) and the instance drill-down."""
