"""profiling.service_protocol's floor for a layout of workers sharing this machine (no process is started: the
cluster runs are tests/integration/test_service_protocol.py's)."""
from __future__ import annotations

import pytest

from profiling.lib.machine_peaks import Machine
from profiling.service_protocol import Layout, worker_share


def machine(threads: int, peak: float, bandwidth: float) -> Machine:
    return Machine("cpu", (), "AVX2", threads, {"float32": peak, "int8": 2 * peak}, bandwidth, bandwidth / 2)


MACHINES = {1: machine(1, 100.0, 30.0), 2: machine(2, 200.0, 40.0)}


@pytest.mark.parametrize("layout, peak, bandwidth", [
    (Layout(1, 2), 200.0, 40.0),  # one worker holds the machine
    (Layout(2, 1), 100.0, 20.0),  # a core each, the two threads' bandwidth halved
    (Layout(2, 2), 100.0, 20.0),  # four threads on two cores: each worker gets half of two threads' peaks
    (Layout(1, 1), 100.0, 30.0),
])
def test_a_busy_worker_has_its_threads_peaks_and_its_share_of_the_bandwidth(layout, peak, bandwidth):
    share = worker_share(MACHINES, 2, layout)
    assert share.peaks == {"float32": peak, "int8": 2 * peak}
    assert share.read_bandwidth == bandwidth and share.copy_bandwidth == bandwidth / 2


@pytest.mark.parametrize("text, layout", [("2x1", Layout(2, 1)), ("1x16", Layout(1, 16))])
def test_a_layout_reads_as_workers_by_threads(text, layout):
    assert Layout.parse(text) == layout and str(layout) == text


@pytest.mark.parametrize("text", ["2", "2x", "x1", "0x1", "1x0", "a x b", "2x1x1"])
def test_a_layout_that_is_not_two_positive_counts_is_refused(text):
    with pytest.raises(ValueError, match="WORKERSxTHREADS"):
        Layout.parse(text)
