"""Allmende: event-sourced GPU budgeting and accounting."""

__version__ = "0.1.0"
