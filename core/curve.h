/* core/curve.h — the run's keys: every vgrpo channel authenticates its peers with ZeroMQ CURVE (Curve25519 keys,
 * http://curvezmq.org; libzmq's zmq_curve(7) and ZAP, RFC 27: https://rfc.zeromq.org/spec/27/) and a ZAP handler
 * that accepts only the run's client key (docs/design.md section 3).
 *
 * Threat model: other users of the machine and peers on the network. A process of the same user can read the run's
 * memory and files anyway (ptrace, /proc/PID/fd), so it is not kept out; the keys keep out everyone else.
 *
 * Roles. A run has three key pairs, one per role:
 *   CORE_CURVE_CONTROLLER  the controller's ROUTER (trainer rank 0, `vgrpo eval`, `vgrpo parity`);
 *   CORE_CURVE_REWARD      the reward server's ROUTER (`vgrpo reward-server` or a Python peer);
 *   CORE_CURVE_CLIENT      every DEALER of the run: the rollout workers (to the controller and to the reward server).
 * A server sets its own pair (core_curve_server) and runs a ZAP handler (core_curve_zap_start) whose allow-list is
 * the client public key; a client sets the client pair and the public key of the server it connects to
 * (core_curve_client), so a client also knows it talks to the run's server: a fake controller cannot complete
 * the handshake with a worker, and a process without the client secret cannot reach a server.
 * Without a ZAP handler libzmq's CURVE accepts ANY client key: always start it before binding. As a second line,
 * core_curve_peer() gives the ZAP user id of a received message ("vgrpo-client" when the handler accepted it);
 * a server with keys drops messages whose connection has none.
 *
 * Who holds what (core_curve_subset): a process gets every public key of the run and only its own role's secret:
 *   controller: the controller secret;  reward server: the reward secret;  worker (client): the client secret.
 * A server's allow-list is the client public key; a client checks the server's public key.
 *
 * How a process receives the keys (never the environment, never the command line):
 *   1. a child of the job's supervisor (cli/job.c): option `--keys-fd N`. N is a file descriptor the child inherits
 *      (a memfd made by core_curve_memfd, close-on-exec cleared in the child only); reading it from offset 0 to
 *      its end gives the key text below. The child reads it once at start (core_curve_read_fd, which closes it)
 *      before opening any socket. The supervisor generates the keys (core_curve_generate) when the job starts.
 *   2. a process started outside the job (an external reward server named by reward.endpoint, a worker on another
 *      machine, a Python peer): option `--keys-file PATH`, the same text in a regular file owned by the user with
 *      mode 0600 or 0400 (core_curve_load_file refuses a file that others can read or write, or a symlink).
 *      core_curve_write_file writes one (mode 0600 whatever the umask).
 *   2b. a rank of a run launched as one MPI job (cli/launch_mpi.c: `vgrpo run --launcher mpirun`, srun): rank 0
 *      generates the keys after MPI_Init and sends each rank its role's subset as key text over MPI, point to point
 *      (core_curve_format / core_curve_parse); no file, environment or command line holds them.
 *   3. neither option: no keys, plain ZeroMQ as before (tests, `vgrpo rollout-worker` or `vgrpo reward-server` run
 *      by hand for debugging; the process says so in its log). `vgrpo run` in local mode opens no channel.
 * core_curve_options() does 1-3 for a command's `--keys-fd` / `--keys-file` pair.
 *
 * The key text (ASCII, one item a line, '\n' or "\r\n"; blank lines and lines starting with '#' ignored):
 *     vgrpo-keys 1
 *     controller-public <40 Z85 characters>
 *     controller-secret <40 Z85 characters>
 *     reward-public <40 Z85 characters>
 *     reward-secret <40 Z85 characters>
 *     client-public <40 Z85 characters>
 *     client-secret <40 Z85 characters>
 * The first line is required; each key line is optional and appears at most once; a secret needs its public, and
 * the public must be the one the secret derives (zmq_curve_public). Z85 is ZeroMQ's text form of a 32-byte key
 * (rfc.zeromq.org/spec/32; pyzmq: zmq.curve_keypair() returns the same text as bytes).
 *
 * A Python peer: sock.curve_secretkey = reward-secret, sock.curve_publickey = reward-public, sock.curve_server =
 * True, and a ZAP handler (zmq.auth.thread.ThreadAuthenticator with configure_curve_callback, or a REP socket on
 * inproc://zeromq.zap.01) that accepts only client-public. */
#ifndef CORE_CURVE_H
#define CORE_CURVE_H

#include <stddef.h>
#include <zmq.h>

#define CORE_CURVE_Z85_LEN 40 /* characters of a key in Z85 text (32 bytes) */
#define CORE_CURVE_TEXT_MAX 1024 /* the key text is at most this long */
#define CORE_CURVE_ZAP_DOMAIN "vgrpo"
#define CORE_CURVE_USER_ID "vgrpo-client" /* the ZAP user id of an accepted client */

typedef enum { CORE_CURVE_CONTROLLER = 0, CORE_CURVE_REWARD = 1, CORE_CURVE_CLIENT = 2, CORE_CURVE_N_ROLES = 3 } core_curve_role;

/* A key set: per role, the public and secret key in Z85 text, "" when this set does not hold it. */
typedef struct {
    char pub[CORE_CURVE_N_ROLES][CORE_CURVE_Z85_LEN + 1];
    char sec[CORE_CURVE_N_ROLES][CORE_CURVE_Z85_LEN + 1];
} core_curve_keys;

/* "controller", "reward", "client". */
const char *core_curve_role_name(core_curve_role role);

/* 1 when this libzmq supports CURVE (zmq_has("curve")), else 0. */
int core_curve_available(void);

/* Fresh key pairs for all three roles. -1 with core_error when libzmq has no CURVE. */
int core_curve_generate(core_curve_keys *k);

/* 1 when k holds role's public key (and, with need_secret, its secret key). */
int core_curve_has(const core_curve_keys *k, core_curve_role role, int need_secret);

/* out = the part of all that the process of role `who` needs (see the header comment): CORE_CURVE_CONTROLLER,
 * CORE_CURVE_REWARD (a server: its pair and the client public) or CORE_CURVE_CLIENT (the client pair and both
 * servers' publics). Keys `all` lacks stay "". */
void core_curve_subset(const core_curve_keys *all, core_curve_role who, core_curve_keys *out);

/* Writes k as key text (format above) into buf (NUL-terminated). -1 with core_error when cap is too small. */
int core_curve_format(const core_curve_keys *k, char *buf, size_t cap);

/* Parses key text of len bytes into k. -1 with core_error naming the line (1-based) and what is wrong: no
 * `vgrpo-keys 1` first line, an unknown item, a key that is not 40 Z85 characters, an item twice, a secret without
 * its public or not matching it. The message never quotes a secret. */
int core_curve_parse(const char *text, size_t len, core_curve_keys *k);

/* A close-on-exec memfd holding k as key text, for a child's `--keys-fd`: the supervisor clears close-on-exec in
 * the child only (after fork), passes the number, and closes its own copy when the job ends. -1 with
 * core_error. */
int core_curve_memfd(const core_curve_keys *k);

/* Reads the key text from fd (from offset 0 with pread when fd is seekable, else read to end of file) and closes
 * fd. -1 with core_error naming `--keys-fd N`: not an open descriptor, empty, too long, bad text. */
int core_curve_read_fd(int fd, core_curve_keys *k);

/* Reads a key file. Refused (-1 with core_error naming the path and the fix): a symlink, not a regular file, owned
 * by another user, any group/other permission bit set (e.g. "mode 0644 lets other users read the run's keys:
 * chmod 600 PATH"), bad text. */
int core_curve_load_file(const char *path, core_curve_keys *k);

/* Writes k to path, created with mode 0600 whatever the umask; refuses (-1) when path exists. */
int core_curve_write_file(const char *path, const core_curve_keys *k);

/* A command's key options: keys_fd >= 0 reads that descriptor, keys_file != NULL reads that file, both is an error,
 * neither gives *have = 0 and an empty k (plain ZeroMQ). *have = 1 when keys were read. -1 with core_error. */
int core_curve_options(int keys_fd, const char *keys_file, core_curve_keys *k, int *have);

/* Makes sock (a ROUTER, before zmq_bind) a CURVE server with role's key pair and the ZAP domain "vgrpo". -1 with
 * core_error when k lacks role's secret or libzmq refuses. Start the context's ZAP handler before the bind. */
int core_curve_server(void *sock, const core_curve_keys *k, core_curve_role role);

/* Makes sock (a DEALER, before zmq_connect) a CURVE client with the client pair, expecting `server`'s public key.
 * -1 with core_error when k lacks one of them. A server with another key never completes the handshake: nothing
 * is delivered either way (libzmq retries the connection). */
int core_curve_client(void *sock, const core_curve_keys *k, core_curve_role server);

/* The ZAP handler of one ZeroMQ context: a thread with a REP socket on inproc://zeromq.zap.01 that accepts CURVE
 * handshakes in domain "vgrpo" whose client public key is one of allow[0..n_allow) (Z85 text; user id
 * "vgrpo-client") and refuses every other handshake (status 400), logging each refusal (core_log_warn, with `who`
 * and the peer's address; the first 10, then every 1000th). One handler per context: start it before binding the
 * server socket, stop it before zmq_ctx_term. NULL with core_error on failure (bad key, a handler already bound). */
typedef struct core_curve_zap core_curve_zap;
core_curve_zap *core_curve_zap_start(void *zmq_ctx, const char *const *allow, int n_allow, const char *who);
/* Handshakes accepted and refused so far. */
long core_curve_zap_accepted(const core_curve_zap *z);
long core_curve_zap_refused(const core_curve_zap *z);
/* Stops the thread and closes its sockets (NULL: nothing). */
void core_curve_zap_stop(core_curve_zap *z);

/* The CURVE part of a ZAP decision, for a server that runs its own ZAP handler (there is one per context: e.g. one
 * that also limits connections). f[0..n) are the frames of one ZAP request (RFC 27). Returns 1 when it is a CURVE
 * handshake in domain "vgrpo" whose client public key is one of allow[0..n_allow) (Z85 text; a bad entry never
 * matches): reply status "200" with user id CORE_CURVE_USER_ID. Else 0 and *why (may be NULL) a short reason for a
 * "400" reply ("not the run's client key", "not a CURVE handshake", ...). */
int core_curve_zap_check(zmq_msg_t *f, int n, const char *const *allow, int n_allow, const char **why);

/* The ZAP user id of the connection a received frame came from ("vgrpo-client" for a client the handler accepted),
 * or NULL when the connection was not authenticated by a ZAP handler. */
const char *core_curve_peer(zmq_msg_t *frame);

#endif
