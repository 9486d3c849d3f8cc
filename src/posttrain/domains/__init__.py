"""Task families (domains). Each module registers its domain(s) at import."""
