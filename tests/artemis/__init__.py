"""The real Apache ActiveMQ Artemis broker for tests: install.sh fetches it, broker.py runs it."""
