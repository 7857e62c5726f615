"""profiling.service_protocol's machine for a layout of workers sharing it (no process is started: the
cluster runs are tests/integration/test_service_protocol.py's)."""
from __future__ import annotations

import pytest

from profiling.lib.machine_peaks import Machine
from profiling.service_protocol import Layout, layout_machine


def machine(threads: int, peak: float, bandwidth: float) -> Machine:
    return Machine("cpu", (), "AVX2", threads, {"float32": peak, "int8": 2 * peak}, bandwidth, bandwidth / 2)


MACHINES = {1: machine(1, 100.0, 30.0), 2: machine(2, 200.0, 40.0)}


@pytest.mark.parametrize("layout, peak, bandwidth", [
    (Layout(1, 2), 200.0, 40.0),  # one worker holds the machine: one copy of the weights
    (Layout(2, 1), 200.0, 20.0),  # two workers: both cores' peaks, two copies through the two threads' bandwidth
    (Layout(2, 2), 200.0, 20.0),  # four threads on two cores: still two cores' peaks
    (Layout(1, 1), 100.0, 30.0),  # one worker on one core
])
def test_the_layouts_machine_has_its_threads_peaks_and_a_copy_of_the_weights_a_worker(layout, peak, bandwidth):
    machine = layout_machine(MACHINES, 2, layout)
    assert machine.peaks == {"float32": peak, "int8": 2 * peak}
    assert machine.read_bandwidth == bandwidth and machine.copy_bandwidth == bandwidth / 2


@pytest.mark.parametrize("text, layout", [("2x1", Layout(2, 1)), ("1x16", Layout(1, 16))])
def test_a_layout_reads_as_workers_by_threads(text, layout):
    assert Layout.parse(text) == layout and str(layout) == text


@pytest.mark.parametrize("text", ["2", "2x", "x1", "0x1", "1x0", "a x b", "2x1x1"])
def test_a_layout_that_is_not_two_positive_counts_is_refused(text):
    with pytest.raises(ValueError, match="WORKERSxTHREADS"):
        Layout.parse(text)
