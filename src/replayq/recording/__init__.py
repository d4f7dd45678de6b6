"""The recording context: a handler's only door to the world."""
