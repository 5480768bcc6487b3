#!/bin/sh
# SuspendProgram: slurmctld runs it with the hostlist to power down as $1 (no arguments in slurm.conf).
exec /usr/local/bin/fleetyield-redfish-reboot --controller-config /etc/fleetyield/fleetyield.toml --suspend "$1"
