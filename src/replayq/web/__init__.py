"""The web dashboard (``replayq web``): a surface like the CLI, over the public API only."""
