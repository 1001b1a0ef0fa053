"""h3batch: a batch text-to-video-with-sound service for FastH3 8-Step V2, and a full-duplex speech load runner.

The installed import names are `h3batch.<room>`; in the checkout each room is a top-level folder (pyproject.toml maps
them). docs/architecture.md draws the rooms and what each may import.
"""
