"""scan() on the machine the tests run on: whatever it has, the scan must not raise and must
give a valid model with publishable labels."""

from __future__ import annotations

import os
from pathlib import Path

from pdd_node.topology.annotation import node_labels
from pdd_node.topology.nics import gpudirect_mode, select_nics
from pdd_node.topology.scan import scan


def test_scan_of_this_machine() -> None:
    topology = scan(Path("/sys"), Path("/proc"))

    assert topology.kernel_release == os.uname().release
    assert node_labels(topology)["pdd.dev/gpudirect"] == topology.gpudirect
    assert gpudirect_mode(topology) == (topology.gpudirect, topology.gpudirect_reason)
    # Every GPU the driver lists under /proc is one the PCI scan found.
    proc_gpus = Path("/proc/driver/nvidia/gpus")
    listed = {entry.name.lower() for entry in proc_gpus.iterdir()} if proc_gpus.is_dir() else set()
    assert listed <= {gpu.pci_address for gpu in topology.gpus}
    assert len(topology.pairs) == len(topology.gpus) * len(topology.nics)
    select_nics(topology, [gpu.index for gpu in topology.gpus])  # must not raise
    if not topology.gpus:
        assert topology.gpudirect == "none"
