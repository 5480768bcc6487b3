# sushy-emulator configuration (a Flask config file: Python) for the docker Slurm cluster's fake BMCs.
#   python3 contrib/redfish/fake_bmc.py --fake --config contrib/redfish/emulator.conf.py
# One fake system per Slurm node; contrib/redfish/power_bridge.py maps each system to the node's container.
SUSHY_EMULATOR_LISTEN_IP = "0.0.0.0"
SUSHY_EMULATOR_LISTEN_PORT = 8000
SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_STATE_DIR = "/var/lib/fake-bmc"  # fake power states persist here (SQLite)
# bcrypt htpasswd (the only digest sushy-tools accepts), e.g.:
#   python3 -c 'import bcrypt; print("fy-admin:" + bcrypt.hashpw(b"PW", bcrypt.gensalt()).decode())'
SUSHY_EMULATOR_AUTH_FILE = "/etc/fake-bmc/htpasswd"
SUSHY_EMULATOR_FAKE_SYSTEMS = [
    {"uuid": "fe11e1d0-0000-4000-8000-000000000001", "name": "c1", "power_state": "On", "nics": []},
    {"uuid": "fe11e1d0-0000-4000-8000-000000000002", "name": "c2", "power_state": "On", "nics": []},
]
FLEETYIELD_FAKE_DELAY_S = 2  # power changes land 2 s after the request (the bridge polls every 0.5 s)
FLEETYIELD_FAKE_STUCK = []  # names of systems that never power back on (a board that does not POST)
