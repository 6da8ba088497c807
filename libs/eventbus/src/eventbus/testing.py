"""pytest plugin placeholder; replaced by the real broker fixtures."""
