"""floe dashboard: a live web page folded from the Kafka topics."""

from dashboard.app import create_app
from dashboard.settings import DashboardSettings
from dashboard.state import DashboardState

__all__ = ["DashboardSettings", "DashboardState", "create_app"]
