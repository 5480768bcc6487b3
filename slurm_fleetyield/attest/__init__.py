"""Tenant-isolation attestation, controller side: enrolment, nonces, policy, verification, verdicts.

``store`` (SQLite: enrolled node keys, issued/used nonces, latest verdicts), ``policy`` (allowed digests
per node class), ``baseline`` (a policy learnt from a golden node's quote), ``verdict`` (signed verdicts
and their offline check), ``verify`` (``attest_node``: quote -> verdict; ``AttestService``: what the
listener and the daemon call), ``cli`` (``fleetyield attest ...``).
"""
