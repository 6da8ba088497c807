"""floe gateway: a provider-faithful model-API proxy that records every token (see ``gateway.app``)."""

from gateway.app import create_app
from gateway.registry import SessionCredentials, SessionRegistry
from gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "SessionCredentials", "SessionRegistry", "create_app"]
