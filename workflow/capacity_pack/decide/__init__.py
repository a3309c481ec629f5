"""The decision: capacity selection, replica/GPU sizing with headroom, and the pack report."""
