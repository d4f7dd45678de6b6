"""The shop example: orders, stock, payments, shipping and invoices on replayq.

``replayq.demo.shop.app:app`` is the application; ``replayq.demo.shop.services`` the
external services it talks to; ``replayq demo`` runs the ShipOrder incident on
them (see docs/runbook.md).
"""
