"""What runs on a GPU node: the topology scan and model (`topology/`), the engine pod's
preflight init container (`preflight.py`) and the node agent that publishes the topology on its
Node (`agent.py`, the only module that talks to the API server, through `kube.py`)."""
