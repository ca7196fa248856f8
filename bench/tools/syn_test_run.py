# syn_test_run.py ROUNDS CALLS NS:PROG_ID NS:PROG_ID (syn-path-ab.sh): bursts of
# CALLS test runs, one SYN to 10.99.0.1:8080 each, alternated between the
# programs ROUNDS times; the time per run each burst (the kernel's BPF
# statistics: kernel.bpf_stats_enabled), its median, and the ratio of the
# second to the first round by round.
import ctypes, struct, sys, random, os, statistics
libc = ctypes.CDLL(None, use_errno=True)
def bpf(cmd, attr, size=160):
    buf = ctypes.create_string_buffer(bytes(attr), size)
    r = libc.syscall(321, cmd, buf, size)
    if r < 0: raise OSError(ctypes.get_errno(), "bpf %d" % cmd)
    return r, buf
def csum(b):
    if len(b)%2: b+=b'\0'
    s=sum(struct.unpack('!%dH'%(len(b)//2),b)); s=(s&0xffff)+(s>>16); s=(s&0xffff)+(s>>16); return (~s)&0xffff
def frame(src):
    dst=bytes([10,99,0,1])
    tcp=struct.pack('!HHIIBBHHH',random.randrange(1024,65535),8080,random.getrandbits(32),0,5<<4,0x02,64240,0,0)
    ph=src+dst+struct.pack('!BBH',0,6,len(tcp))
    tcp=tcp[:16]+struct.pack('!H',csum(ph+tcp))+tcp[18:]
    ip=struct.pack('!BBHHHBBH4s4s',0x45,0,20+len(tcp),1,0,64,6,0,src,dst)
    ip=ip[:10]+struct.pack('!H',csum(ip))+ip[12:]
    f=bytes.fromhex('020000000001020000000002')+b'\x08\x00'+ip+tcp
    return f+b'\0'*(60-len(f))
random.seed(1)
frames=[ctypes.create_string_buffer(frame(bytes([100,64+random.randrange(64),random.randrange(256),random.randrange(1,255)])),60) for _ in range(8192)]
out=ctypes.create_string_buffer(256)
rounds=int(sys.argv[1]); calls=int(sys.argv[2])
progs=[]
for a in sys.argv[3:]:
    ns,pid=a.split(':')
    nsfd=os.open(f"/run/netns/{ns}", os.O_RDONLY)
    fd,_=bpf(13, struct.pack("I", int(pid)))
    progs.append((a,nsfd,fd))
def stats(fd):
    ib=ctypes.create_string_buffer(256)
    bpf(15, struct.pack("<IIQ", fd, 256, ctypes.addressof(ib)))
    # struct bpf_prog_info: run_time_ns at 192, run_cnt at 200
    return struct.unpack_from("<QQ", ib, 192)
res={a:[] for a,_,_ in progs}
rets={a:{} for a,_,_ in progs}
k=0
for r in range(rounds):
    for a,nsfd,fd in progs:
        libc.setns(nsfd, 0x40000000)
        t0,c0=stats(fd)
        for i in range(calls):
            f=frames[k%8192]; k+=1
            attr=struct.pack("<IIIIQQII", fd, 0, 60, 256, ctypes.addressof(f), ctypes.addressof(out), 1, 0)
            _, b = bpf(10, attr)
            rv=struct.unpack_from("<I", b, 4)[0]; rets[a][rv]=rets[a].get(rv,0)+1
        t1,c1=stats(fd)
        res[a].append((t1-t0)/max(1,c1-c0))
for a in res:
    v=res[a]
    print(a, "median %.1f  min %.1f  max %.1f ns/run" % (statistics.median(v), min(v), max(v)), rets[a])
h=[x for x in res.values()]
if len(h)==2:
    ratios=[b/a for a,b in zip(h[0],h[1])]
    print("second/first per round: median %.3f (%.3f-%.3f)" % (statistics.median(ratios), min(ratios), max(ratios)))
