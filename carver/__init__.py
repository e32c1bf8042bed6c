"""Analytical, Hopper-aware tiling model that ranks TileLang hints."""
