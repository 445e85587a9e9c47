"""Allmende's contracts: event models, the ledger-entry record and the ClickHouse DDL."""
