"""GPU broker: plans, launches and pays for training jobs at the lowest price that is on time."""
