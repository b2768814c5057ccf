"""kombu's file-system transport, with messages written atomically.

kombu's own ``_put`` creates the message file under its final name and then writes it, so
a consumer in another process can move and read the file before the bytes are in and
crash on an empty message. Here a message is written under a hidden temporary name that
consumers skip, then renamed into place (atomic on one file system).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

TRANSPORT_PATH = "broker.devstack.fs_transport:Transport"  # for Celery's broker_transport


class Channel(filesystem.Channel):
    """File-system channel whose messages appear whole or not at all."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: kombu's _get compares what follows the first "." with the queue.
        temporary = os.path.join(self.data_folder_out, f".tmp-{name}")
        try:
            with open(temporary, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, final)
        except OSError as error:
            raise filesystem.ChannelError(f"cannot add {final!r} to the queue folder") from error


class Transport(filesystem.Transport):
    """kombu's file-system transport with :class:`Channel`."""

    Channel = Channel
