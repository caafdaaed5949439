/* core/host_addr.h — which address a server of a run binds its TCP endpoint on when the run spans hosts (an MPI
 * launch, cli/launch_mpi.c): never the wildcard 0.0.0.0 (which would listen on every interface, and which a peer
 * cannot connect to), but one address of this host that the other hosts of the run reach.
 *
 * The choice, core_host_addr_pick:
 *   1. an explicit address (`--bind-host ADDR`, or the environment variable VGRPO_BIND_HOST, which can differ per
 *      host): the name of one of this host's interfaces (eth0, ib0: its IPv4 address here, so one name serves every
 *      host of a cluster), a numeric IPv4 address, or a name resolving to one; 0.0.0.0, "*" and "" are refused;
 *   2. every process of the run on this host: 127.0.0.1 (loopback only: nothing of the run listens on the network);
 *   3. else the address of the interface the kernel routes to the other hosts through: the local address of a UDP
 *      socket connect()ed to one of them (no packet is sent), the first peer whose name resolves and whose route is
 *      not loopback;
 *   4. else this host's name, when it resolves to an address that is not loopback;
 *   5. else an error naming --bind-host.
 * IPv4 only (ZeroMQ binds IPv6 only with ZMQ_IPV6 set; a cluster's private network is IPv4 in practice). */
#ifndef CORE_HOST_ADDR_H
#define CORE_HOST_ADDR_H

#include <stddef.h>

/* Environment variable naming the address to bind (rule 1). */
#define CORE_HOST_ADDR_ENV "VGRPO_BIND_HOST"

/* The numeric IPv4 address of host (an interface of this host, a dotted quad, or a name resolved with getaddrinfo,
 * AF_INET) into out (>= 16 bytes). Refuses the wildcard (0.0.0.0, "*", "") naming `what` (e.g. "--bind-host"). -1 with core_error. */
int core_host_addr_resolve(const char *host, const char *what, char *out, size_t cap);

/* The local IPv4 address this host uses to reach peer (a name or address): a UDP socket connect()ed to it, then
 * getsockname. -1 with core_error when peer does not resolve or no route leads there. */
int core_host_addr_route(const char *peer, char *out, size_t cap);

/* The rules of the header comment. explicit_addr: --bind-host (NULL: none; the environment variable is read when
 * NULL); self: this host's name; hosts[0..n): the host names of every process of the run (this one's included).
 * out (>= 16 bytes) gets the numeric address; how (may be NULL, >= 64 bytes) a few words on which rule chose it,
 * for the log ("--bind-host", "VGRPO_BIND_HOST", "one host: loopback", "the route to HOST", "this host's name").
 * -1 with core_error. */
int core_host_addr_pick(const char *explicit_addr, const char *self, const char *const *hosts, int n, char *out,
                        size_t cap, char *how, size_t how_cap);

#endif
