import pytest
from nightjar_contract.memory import BackoffConfig
from nightjar_worker.memory.fault import FaultInjector, InjectedFault, RetryBackoff
from pydantic import ValidationError


def test_injector_fails_exactly_n_reloads():
    inj = FaultInjector.from_env({"NIGHTJAR_FAULT_RELOAD": "2"})
    for _ in range(2):
        with pytest.raises(InjectedFault):
            inj.check_reload()
    inj.check_reload()  # third one passes
    assert inj.remaining == 0


def test_injector_default_and_bad_value():
    FaultInjector.from_env({}).check_reload()
    with pytest.raises(ValueError, match="NIGHTJAR_FAULT_RELOAD"):
        FaultInjector.from_env({"NIGHTJAR_FAULT_RELOAD": "many"})
    with pytest.raises(ValueError, match="NIGHTJAR_FAULT_RELOAD"):
        FaultInjector.from_env({"NIGHTJAR_FAULT_RELOAD": "-1"})


def test_backoff_grows_caps_and_resets():
    b = RetryBackoff(BackoffConfig(base_s=1, factor=2, max_s=5))
    assert b.allowed(0)
    assert [b.record_failure(0) for _ in range(5)] == [1, 2, 4, 5, 5]
    assert not b.allowed(4.9) and b.allowed(5.0)
    b.record_success()
    assert b.allowed(0) and b.failures == 0
    with pytest.raises(ValidationError, match="factor"):
        BackoffConfig(factor=0.5)
