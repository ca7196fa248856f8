#!/usr/bin/env python3
"""Writes a MaxMind DB file with PyPI's mmdb-writer, for policer's tests.

    write_mmdb.py SPEC.json OUT.mmdb

SPEC: {"ip_version": 6, "database_type": "GeoLite2-Country",
       "networks": [["10.0.0.0/8", {"country": {"iso_code": "FR"}}], ...]}
Networks are inserted in order (a network inside an earlier one splits it,
as the writer does). IPv4 networks go to ::/96 (the writer's
ipv4_compatible); an IPv6 network under ::ffff:0:0/96 stays there, a
subtree of its own. Prints the writer's list: every leaf of its search
tree as [network, record], IPv4 as IPv4 (from ::/96 and ::ffff:0:0/96),
each network once, sorted -- what a reader of the whole tree must find.
"""
import ipaddress
import json
import sys

from mmdb_writer import MMDBWriter, SearchTreeLeaf, SearchTreeNode
from netaddr import IPSet


def leaves(node, bits, depth, width, out):
    for bit, child in ((0, node.left), (1, node.right)):
        if child is None:
            continue
        value = (bits << 1) | bit
        if isinstance(child, SearchTreeLeaf):
            out.append((value << (width - depth - 1), depth + 1, child.value))
        elif isinstance(child, SearchTreeNode):
            leaves(child, value, depth + 1, width, out)


def main():
    spec = json.load(open(sys.argv[1]))
    version = spec.get("ip_version", 6)
    w = MMDBWriter(ip_version=version, database_type=spec.get("database_type", "policer-test"),
                   ipv4_compatible=version == 6)
    for net, record in spec["networks"]:
        w.insert_network(IPSet([net]), record)
    w.to_db_file(sys.argv[2])
    width = 128 if version == 6 else 32
    found = []
    leaves(w.tree, 0, 0, width, found)
    seen = {}
    for value, plen, record in found:
        if width == 32:
            net = ipaddress.ip_network((value, plen))
        else:
            net6 = ipaddress.IPv6Network((value, plen))
            mapped = ipaddress.IPv6Network("::ffff:0:0/96")
            compat = ipaddress.IPv6Network("::/96")
            if plen >= 96 and (net6.subnet_of(mapped) or net6.subnet_of(compat)):
                net = ipaddress.IPv4Network((value & 0xFFFFFFFF, plen - 96))
            else:
                net = net6
        seen.setdefault(str(net), (net, record))
    listed = sorted(seen.values(), key=lambda p: (p[0].version, p[0].network_address, p[0].prefixlen))
    json.dump([[str(n), r] for n, r in listed], sys.stdout)


if __name__ == "__main__":
    main()
