#!/usr/bin/env python3
"""sushy-emulator with its fake systems driver, made deterministic for tests and the docker cluster.

Runs ``sushy_tools.emulator.main`` unchanged except for two knobs of the fake driver, read from the same
Flask config file as every ``SUSHY_EMULATOR_*`` option (``--config FILE``):

* ``FLEETYIELD_FAKE_DELAY_S`` (int, default 1): the fake driver applies a power change 1-11 s (at random)
  after the request, observed on the next read. Tests want a fixed, short delay.
* ``FLEETYIELD_FAKE_STUCK`` (list of system names): these systems accept power-on requests but never come
  back On: a board that does not POST. Power-off still works.

Everything else (Redfish routes, HTTP basic auth via ``SUSHY_EMULATOR_AUTH_FILE``, the systems list
``SUSHY_EMULATOR_FAKE_SYSTEMS``, state in ``SUSHY_EMULATOR_STATE_DIR``) is sushy-tools' own.

    python3 contrib/redfish/fake_bmc.py --fake --config contrib/redfish/emulator.conf.py
"""

from __future__ import annotations

import time

from sushy_tools.emulator import main as emulator
from sushy_tools.emulator.resources.systems import fakedriver

_original_set_power_state = fakedriver.FakeDriver.set_power_state


def _set_power_state(self, identity, state):  # type: ignore[no-untyped-def]
    _original_set_power_state(self, identity, state)
    system = self._get(identity)
    pending = system.get("pending_power")
    if not pending:
        return
    delay = int(self._config.get("FLEETYIELD_FAKE_DELAY_S", 1))
    apply_time = time.time() + delay
    if system["name"] in self._config.get("FLEETYIELD_FAKE_STUCK", ()) and pending["power_state"] != "Off":
        apply_time = float("inf")  # never POSTs
    self._update(system, pending_power={**pending, "apply_time": apply_time})


fakedriver.FakeDriver.set_power_state = _set_power_state

if __name__ == "__main__":
    emulator.main()
