/* core/host_addr.c — the address a run's server binds on (see core/host_addr.h). */
#include "core/host_addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"

static int is_loopback(struct in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

/* The first IPv4 address of host, or -1 with core_error naming `what`. */
static int lookup(const char *host, const char *what, struct in_addr *a) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    const int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc || !res) {
        if (res) freeaddrinfo(res);
        return core_error("%s: \"%s\" does not resolve to an IPv4 address (%s)", what, host,
                          rc ? gai_strerror(rc) : "no address");
    }
    *a = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 0;
}

static int to_text(struct in_addr a, char *out, size_t cap) {
    if (!inet_ntop(AF_INET, &a, out, (socklen_t)cap)) return core_error("address text: %s", strerror(errno));
    return 0;
}

int core_host_addr_resolve(const char *host, const char *what, char *out, size_t cap) {
    if (!host || !host[0] || !strcmp(host, "*") || !strcmp(host, "0.0.0.0"))
        return core_error("%s: \"%s\" is the wildcard (every interface): give one address of this host that the other "
                          "hosts reach (127.0.0.1 when the run is on one machine)", what, host ? host : "");
    struct in_addr a;
    /* an interface's name (eth0, ib0): its IPv4 address on this host, so one name serves every host of a cluster */
    struct ifaddrs *ifs = NULL;
    int found = 0;
    if (!getifaddrs(&ifs))
        for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !strcmp(i->ifa_name, host))
                a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr, found = 1;
    if (ifs) freeifaddrs(ifs);
    if (!found && lookup(host, what, &a)) return -1;
    if (a.s_addr == htonl(INADDR_ANY))
        return core_error("%s: \"%s\" resolves to the wildcard 0.0.0.0: give one address of this host", what, host);
    return to_text(a, out, cap);
}

int core_host_addr_route(const char *peer, char *out, size_t cap) {
    struct in_addr a;
    if (lookup(peer, "peer host", &a)) return -1;
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return core_error("route to %s: socket: %s", peer, strerror(errno));
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr = a}, me;
    socklen_t len = sizeof me;
    /* connect() on a UDP socket only picks the route and the local address: nothing is sent */
    if (connect(fd, (struct sockaddr *)&to, sizeof to) || getsockname(fd, (struct sockaddr *)&me, &len)) {
        const int e = errno;
        close(fd);
        return core_error("route to %s: %s", peer, strerror(e));
    }
    close(fd);
    return to_text(me.sin_addr, out, cap);
}

int core_host_addr_pick(const char *explicit_addr, const char *self, const char *const *hosts, int n, char *out,
                        size_t cap, char *how, size_t how_cap) {
    char dummy[8];
    if (!how) how = dummy, how_cap = sizeof dummy;
    const char *env = explicit_addr ? NULL : getenv(CORE_HOST_ADDR_ENV);
    if (explicit_addr || env) {
        snprintf(how, how_cap, "%s", explicit_addr ? "--bind-host" : CORE_HOST_ADDR_ENV);
        return core_host_addr_resolve(explicit_addr ? explicit_addr : env, how, out, cap);
    }
    int others = 0;
    for (int i = 0; i < n; i++) others += strcmp(hosts[i], self) != 0;
    if (!others) {
        snprintf(how, how_cap, "one host: loopback");
        snprintf(out, cap, "127.0.0.1");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (!strcmp(hosts[i], self)) continue;
        int seen = 0; /* each peer host once */
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(hosts[j], hosts[i]);
        char a[64];
        struct in_addr in;
        if (seen || core_host_addr_route(hosts[i], a, sizeof a) || inet_pton(AF_INET, a, &in) != 1 || is_loopback(in))
            continue;
        snprintf(how, how_cap, "the route to %s", hosts[i]);
        snprintf(out, cap, "%s", a);
        return 0;
    }
    struct in_addr a;
    if (!lookup(self, "this host", &a) && !is_loopback(a) && a.s_addr != htonl(INADDR_ANY)) {
        snprintf(how, how_cap, "this host's name");
        return to_text(a, out, cap);
    }
    return core_error("cannot tell which address of %s the other hosts of the run reach (none of their names resolves "
                      "here to a route, and %s's own name resolves to no address other than loopback): give "
                      "--bind-host ADDR or set %s on this host", self, self, CORE_HOST_ADDR_ENV);
}
