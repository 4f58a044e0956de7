"""Benchmarks for django-jobguard, run by hand: ``python bench/run.py [--smoke] [--only X]``."""
