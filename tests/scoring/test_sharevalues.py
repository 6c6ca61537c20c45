"""GPU shares priced by the cutting-stock LP: values, bounds, regret; each number worked out by hand."""
import numpy as np
import pytest

from scoring.fragmentation import Shape, Workload
from scoring.sharevalues import ShareValues, cutting_stock, knapsack, share_mix


def test_bounded_knapsack():
    # Two 300s at most in 1000: 600 is the best by count; the table is monotone in capacity.
    best, takes = knapsack(np.array([300]), np.array([1.0]), np.array([2]))
    assert best[1000] == 2 and best[599] == 1 and best[299] == 0
    assert takes[0][1000] == 2


def test_an_810_is_a_whole_gpu_and_a_160_is_free_when_810s_outnumber_them():
    # 10 x 810 need 10 GPUs whatever happens; 4 x 160 ride along in the 190s the 810s leave.
    lp = cutting_stock({810: 10, 160: 4})
    assert lp.optimal
    assert lp.values == pytest.approx({810: 1000.0, 160: 0.0})
    assert lp.waste_milli == pytest.approx(10 * 1000 - 10 * 810 - 4 * 160)  # 1260


def test_optional_shares_fill_what_mandatory_ones_leave():
    # 10 x 810 must be packed; up to 20 x 160 may be: one 160 per 810 GPU, waste 10 x 30.
    lp = cutting_stock({810: 10}, {810: 10, 160: 20})
    assert lp.waste_milli == pytest.approx(300.0)
    # Nothing optional: the 810s alone.
    assert cutting_stock({810: 10}, {}).waste_milli == pytest.approx(1900.0)


def test_values_and_regret():
    # Mix 470 : 650 : 320 : 230 = 2 : 1 : 1 : 1. Optimal patterns 470+470, 650+320, 4 x 230, so the values are
    # 500, 2/3, 1/3 and 1/4 of a GPU.
    lp = cutting_stock({470: 400, 650: 200, 320: 200, 230: 200})
    assert lp.values == pytest.approx({470: 500.0, 650: 2000 / 3, 320: 1000 / 3, 230: 250.0})
    sv = ShareValues(lp.values)
    # A 230 next to a 650 leaves 120 that no share of the mix fills: it loses K(350) - K(120) - z(230) =
    # 333.3 - 0 - 250 = 83.3 against the 650+320 pattern. On an empty GPU it sits on the 4 x 230 pattern: 0.
    assert sv.regret([350, 1000], 230) == pytest.approx([1000 / 3 - 250, 0.0])
    # A 320 next to a 470 leaves 210: K(530) - K(210) - z(320) = 500 - 0 - 333.3.
    assert sv.regret([530], 320) == pytest.approx([500 - 1000 / 3])
    # A size outside the mix is worth what the mix could put in its room (nothing fits 100: 0): a 100 on an empty
    # GPU leaves 900, where 650 + 230 (916.7) is the best the mix does, against 1000 for a full pattern.
    assert sv.regret([1000], 100) == pytest.approx([1000 - (2000 / 3 + 250)])
    assert (sv.regret(np.arange(230, 1001), 230) >= 0).all()


def test_no_shares_in_the_workload_means_no_regret():
    sv = ShareValues({})
    assert sv.regret([1000, 400], 300).tolist() == [0.0, 0.0]


def test_share_mix_and_bad_sizes():
    w = Workload((Shape(1000, 500, 1, frozenset()), Shape(1000, 500, 1, frozenset({"T4"})),
                  Shape(1000, 1000, 2, frozenset()), Shape(1000, 0, 0, frozenset())), np.array([0.2, 0.3, 0.4, 0.1]))
    assert share_mix(w) == pytest.approx({500: 0.5})
    with pytest.raises(ValueError, match="share sizes"):
        cutting_stock({1000: 3})
    with pytest.raises(ValueError, match="upper count"):
        cutting_stock({500: 3}, {500: 2})


def test_regret_refuses_a_share_that_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        ShareValues({500: 500.0}).regret([400, 600], 500)


def test_the_values_of_a_mix_are_solved_once():
    """A planner makes a policy per gang, and the LP is a pure function of the share mix: equal mixes share one
    answer (the gang controller solved it over a thousand times a round), other mixes get their own."""
    from scoring.fragmentation import Workload
    from scoring.model import PodDemand
    from scoring.sharevalues import ShareValues

    pods = [PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=m) for m in (300, 300, 650, 1000)]
    first = ShareValues.of(Workload.typical(pods))
    assert ShareValues.of(Workload.typical(list(reversed(pods)))) is first
    other = ShareValues.of(Workload.typical([*pods, PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=230)]))
    assert other is not first and other.values != first.values
