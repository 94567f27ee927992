import ctypes, mmap, sys, threading, time, numpy as np, torch
from tdcollect.envs import ParallelEnv
from benchmarks.workloads import WORKLOADS
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
def region(nbytes):
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, np.uint8)
    return a
def populate(a):
    addr = a.ctypes.data
    r = libc.madvise(addr, a.nbytes, 23)
    if r: print("madvise errno", ctypes.get_errno())
if __name__ == "__main__":
    mode = sys.argv[1]
    with ParallelEnv(2, WORKLOADS["atari"], envs_per_worker=4) as env:
        env.set_seed(0); env.reset()
        tmpl = env.fake_tensordict().unsqueeze(-1).expand(*env.batch_size, 100)
        bufs = []
        def empty(x):
            a = region(x.numel() * x.element_size()); bufs.append(a)
            return torch.from_numpy(a).view(x.dtype).view(x.shape)
        out = tmpl.apply(empty)
        th = None
        if mode == "thread":
            th = threading.Thread(target=lambda: [populate(a) for a in bufs if a.nbytes > 1<<20]); th.start()
        s = time.perf_counter(); r = env.rollout(100, break_when_any_done=False, out=out); e = time.perf_counter() - s
        if th: th.join()
        print(mode, f"{r.numel()/e:,.0f} fps")
