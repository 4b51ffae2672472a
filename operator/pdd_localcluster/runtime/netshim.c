/*
 * The pod network stand-in, preloaded into every program of a locally run pod.
 *
 * Pods of the local cluster share the host's network namespace: a network namespace per pod
 * would cut them off the apiserver, which listens on the host's 127.0.0.1. Every pod instead
 * gets an address of its own in 127.0.0.0/8 (all of which routes to loopback), and this shim
 * makes that address behave like the pod's own network:
 *
 *   bind()    of a TCP socket to the wildcard (0.0.0.0, ::), or to localhost (127.0.0.1, ::1)
 *             at a fixed port, binds to the pod's address instead, so pods that all listen
 *             on 0.0.0.0:8099 do not collide and each is reachable at its own address. A
 *             bind to localhost at port 0 is left alone: the kernel's port is unique on the
 *             host anyway, and a program that bound its interface's address (UCX's TCP
 *             transport binds lo's 127.0.0.1) tells its peers that address;
 *   connect() of a TCP socket to 127.0.0.1:P (or ::1, ::ffff:127.0.0.1) goes to POD_IP:P when
 *             something listens there (a LISTEN entry in /proc/net/tcp{,6}), so "localhost" is
 *             the pod's own; otherwise it is left alone (the apiserver on 127.0.0.1, ports of
 *             the host).
 *
 * UDP and other socket types, and other address families, are left alone. The pod's address
 * is read from /.pdd-runtime/pod-ip (written by the sandbox), not from the environment, so the
 * container's environment stays exactly what the pod spec says.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static struct in_addr pod_ip;
static int pod_ip_state; /* 0 unread, 1 known, -1 none */

static int read_pod_ip(void) {
    if (pod_ip_state == 0) {
        char buf[64] = {0};
        FILE *f = fopen("/.pdd-runtime/pod-ip", "re");
        pod_ip_state = -1;
        if (f) {
            if (fgets(buf, sizeof buf, f)) {
                buf[strcspn(buf, "\r\n ")] = 0;
                if (inet_pton(AF_INET, buf, &pod_ip) == 1) pod_ip_state = 1;
            }
            fclose(f);
        }
    }
    return pod_ip_state == 1;
}

static int is_stream(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

static int is_v4_loopback_or_any(in_addr_t a) {
    return a == htonl(INADDR_ANY) || a == htonl(INADDR_LOOPBACK);
}

static void v4_mapped(struct in6_addr *a6, struct in_addr a4) {
    memset(a6, 0, sizeof *a6);
    a6->s6_addr[10] = 0xff;
    a6->s6_addr[11] = 0xff;
    memcpy(&a6->s6_addr[12], &a4, 4);
}

static int is_v6_loopback_or_any(const struct in6_addr *a) {
    struct in6_addr lo4;
    v4_mapped(&lo4, (struct in_addr){htonl(INADDR_LOOPBACK)});
    return IN6_IS_ADDR_UNSPECIFIED(a) || IN6_IS_ADDR_LOOPBACK(a) || memcmp(a, &lo4, sizeof lo4) == 0;
}

/* Whether /proc/net/tcp (or tcp6, v4-mapped) has a LISTEN socket on POD_IP:port. */
static int pod_listens(unsigned port) {
    char want4[32], want6[64], line[512];
    /* The kernel prints the address as the 32-bit word in host byte order. */
    snprintf(want4, sizeof want4, "%08X:%04X", (unsigned)pod_ip.s_addr, port);
    snprintf(want6, sizeof want6, "0000000000000000FFFF0000%08X:%04X", (unsigned)pod_ip.s_addr, port);
    const char *files[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    const char *wants[2] = {want4, want6};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "re");
        if (!f) continue;
        int found = 0;
        while (!found && fgets(line, sizeof line, f)) {
            char local[64], remote[64], state[8];
            if (sscanf(line, " %*d: %63s %63s %7s", local, remote, state) == 3)
                found = strcmp(local, wants[i]) == 0 && strcmp(state, "0A") == 0;
        }
        fclose(f);
        if (found) return 1;
    }
    return 0;
}

typedef int (*sockfn)(int, const struct sockaddr *, socklen_t);

static sockfn next_fn(const char *name) { return (sockfn)dlsym(RTLD_NEXT, name); }

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static sockfn real;
    if (!real) real = next_fn("bind");
    if (!addr || !is_stream(fd) || !read_pod_ip()) return real(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a = *(const struct sockaddr_in *)addr;
        int ephemeral_lo = a.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && a.sin_port == 0;
        if (is_v4_loopback_or_any(a.sin_addr.s_addr) && !ephemeral_lo) a.sin_addr = pod_ip;
        return real(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a = *(const struct sockaddr_in6 *)addr;
        int ephemeral_lo = !IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) && a.sin6_port == 0;
        if (is_v6_loopback_or_any(&a.sin6_addr) && !ephemeral_lo) {
            /* A v4-mapped address needs a dual-stack socket. */
            int off = 0;
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
            v4_mapped(&a.sin6_addr, pod_ip);
        }
        return real(fd, (struct sockaddr *)&a, sizeof a);
    }
    return real(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static sockfn real;
    if (!real) real = next_fn("connect");
    if (!addr || !is_stream(fd) || !read_pod_ip()) return real(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a = *(const struct sockaddr_in *)addr;
        if (a.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && pod_listens(ntohs(a.sin_port))) {
            a.sin_addr = pod_ip;
            return real(fd, (struct sockaddr *)&a, sizeof a);
        }
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a = *(const struct sockaddr_in6 *)addr;
        if (!IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) && is_v6_loopback_or_any(&a.sin6_addr) &&
            pod_listens(ntohs(a.sin6_port))) {
            v4_mapped(&a.sin6_addr, pod_ip);
            return real(fd, (struct sockaddr *)&a, sizeof a);
        }
    }
    return real(fd, addr, len);
}
