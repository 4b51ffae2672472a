"""Pods that really run: the containers of known images as local processes, with the
command, args, env and volumes the pod spec says, each pod at its own 127.x address.

`PodRuntime` is what `NodeSimulator(..., runtime=...)` uses; `images` says which images it
can run; `sandbox` (the container's mount namespace), `netshim.c` (the pod's address),
`podenv`, `volumes` and `probes` do one part each.
"""

from pdd_localcluster.runtime.images import KNOWN_IMAGES, ImageFs
from pdd_localcluster.runtime.podrunner import RuntimeOptions
from pdd_localcluster.runtime.podruntime import PodRuntime

__all__ = ["KNOWN_IMAGES", "ImageFs", "PodRuntime", "RuntimeOptions"]
