"""Tenant-isolation attestation, node side: measure the node, quote it, scrub, hand over.

``chain`` (stdlib: records, PCR-like hash chain, canonical JSON; the controller imports it to replay),
``measure`` (ordered measurement records under an injectable root), ``gpu`` (per-GPU reports from any
backend), ``keys`` (the node's Ed25519 key), ``quote`` (signed quotes), ``tpm`` (the same chain in a TPM
2.0 PCR, quoted by an attestation key through tpm2-tools), ``service`` (what the control socket, the
HTTP exporter and the Epilog hand-over call), ``cli`` (``fleetyield-agent attest ...``).
"""
