import threading

from ext_proc.edge.beside import Beside


def test_the_value_is_computed_on_another_thread_and_waited_for():
    beside = Beside()
    started, release = threading.Event(), threading.Event()
    ran_on = []

    def make():
        ran_on.append(threading.current_thread().name)
        started.set()
        release.wait(5)
        return b"mac"

    waiting = beside(make)
    # The caller goes on while the value is being computed.
    assert started.wait(5)
    assert ran_on[0].startswith("ext_proc-mac")
    assert ran_on[0] != threading.current_thread().name
    release.set()
    assert waiting() == b"mac"
    beside.close()


def test_no_thread_before_the_first_value_and_none_after_close():
    before = {t.name for t in threading.enumerate()}
    beside = Beside()
    assert not any(
        n.startswith("ext_proc-mac") for n in {t.name for t in threading.enumerate()} - before
    )
    assert beside(lambda: b"x")() == b"x"
    beside.close()
    assert not any(t.name.startswith("ext_proc-mac") for t in threading.enumerate())
