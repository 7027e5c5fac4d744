"""The serving side: follow the registry, swap versions in, roll back, keep retention."""
