"""The ``checksum`` repository agent (Triton's checksum_repository_agent): ``MD5:<file>`` parameters give
the digest each file of the model must have, checked before the model loads."""
from __future__ import annotations

import hashlib

from ..errors import ServerError, Status
from ..hookspecs import hookimpl
from ..registry import RepositoryAgentRegistry
from ..repo_agents import AgentAction, AgentModel, RepositoryAgent

ALGORITHMS = {"md5": ("MD5", hashlib.md5)}


class ChecksumAgent(RepositoryAgent):
    """On LOAD, each ``<algorithm>:<relative path>`` parameter's file must have the parameter's hex digest. Only
    regular files inside the model's directory are read (``AgentModel.read_file``); Triton's agent reads any path."""

    def model_action(self, model: AgentModel, action: AgentAction) -> None:
        if action is not AgentAction.LOAD:
            return
        for key, expected in model.parameters.items():
            algorithm, separator, relative = key.partition(":")
            if not separator:
                raise ServerError(f"failed to parse key: {key}", Status.INVALID_ARG)
            if algorithm.lower() not in ALGORITHMS:
                raise ServerError(f"Unsupported checksum algorithm: {algorithm}", Status.UNSUPPORTED)
            label, digest = ALGORITHMS[algorithm.lower()]
            hashed = digest()
            try:
                for chunk in model.read_file(relative):
                    hashed.update(chunk)
            except OSError as error:
                raise ServerError(f"failed to open text file for read {relative}: {error.strerror or error}",
                                  Status.INVALID_ARG) from None
            got = hashed.hexdigest()
            if got != expected:
                raise ServerError(f"Mismatched {label} hash for file {relative}, expect: {expected}, got: {got}",
                                  Status.INVALID_ARG)


@hookimpl
def tserve_register_repository_agents(registry: RepositoryAgentRegistry) -> None:
    registry.add("checksum", ChecksumAgent)
