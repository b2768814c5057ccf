"""GPU offers and prices: the bundled catalog and its live refresh."""
