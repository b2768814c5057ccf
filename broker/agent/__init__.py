"""The code a training instance runs, served to it by the API (``GET /v1/agent``): ``agent.py``,
the agent that runs the job's program and talks to the broker, and ``broker_sdk.py``, the module
the program reports progress and checkpoints with. Both are standalone files (Python standard
library only, 3.8+), so this package imports nothing: the API reads them as package resources.
"""
