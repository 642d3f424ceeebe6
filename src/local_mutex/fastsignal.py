"""The signal API without its enum wrappers.

``import signal`` pulls in enum, functools and collections: about two thirds of a bare
interpreter's start on a small machine, paid by every nested call in a loop. The C module
underneath has the same functions with plain-int signals and handlers, which is all this
package uses (compare handlers with ``==``, never ``is``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:
    try:
        import _signal as signal
    except ImportError:  # an interpreter without the C module split
        import signal

__all__ = ["signal"]
