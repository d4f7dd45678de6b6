"""The queue: job types, their contracts, and each job's lifecycle."""
