"""Cloud adapters behind one Provider protocol; ``providers.local`` runs clouds on a laptop."""
