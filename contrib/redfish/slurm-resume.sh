#!/bin/sh
# ResumeProgram: slurmctld runs it with the hostlist to power up as $1.
exec /usr/local/bin/fleetyield-redfish-reboot --controller-config /etc/fleetyield/fleetyield.toml --resume "$1"
