"""Services: the ledger writer and the FastAPI apps. Thin adapters around `domain`."""
