"""The local development stack: the embedded data folder, the whole broker in processes on one
machine, kombu's file-system transport, and the demo."""
