/* pmix-adapter: the conformance suite's [events] commands on real OpenPMIx.
 *
 * One program, four roles, all on one node:
 *   pmix-adapter server --dir D          a PMIx host server (tool support on); prints
 *                                        {"ready": true} once it serves, runs until SIGTERM
 *   pmix-adapter run --dir D -n N -- CMD a job: asks the server to register a namespace of N
 *                                        processes, starts them with the environment PMIx
 *                                        gives each, prefixes their lines with "[RANK] "
 *   pmix-adapter listen --dir D --chain FILE --timeout SECS
 *                                        a PMIx client (inside a job) or tool (elsewhere)
 *                                        running the chain file's handlers; JSON lines as
 *                                        conformance/README.md ("Events") describes
 *   pmix-adapter notify --dir D CODE --range R [--target NSPACE:RANK]... [--info K=V]...
 *
 * It translates, and never corrects: what the library does is what the lines show. The one
 * translation is the results array: PMIx 4.2 hands a handler a flat list (each earlier
 * handler's name with a status, then that handler's results); the contract's shape nests
 * each handler's results under its entry. conformance/README.md lists what the suite found.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <json.h>
#include <pmix.h>
#include <pmix_server.h>
#include <pmix_tool.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_HANDLERS 256
#define MAX_NOTES 16
#define MAX_PROCS 256
#define MAX_ITEMS 64

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("pmix-adapter: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Microseconds since the Unix epoch: lines' at_us and sent_us, to time delivery across
 * processes of one machine. */
static int64_t unix_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t) t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) < 0 && errno == EINTR)
        ;
}

/* Prints one JSON line (and frees it). */
static void emit(json_object *o)
{
    pthread_mutex_lock(&out_lock);
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    json_object_put(o);
}

/* An asynchronous PMIx operation's completion, waited for with a deadline. */
typedef struct {
    pthread_mutex_t m;
    pthread_cond_t c;
    int done;
    pmix_status_t status;
} waiter_t;

static void waiter_init(waiter_t *w)
{
    pthread_mutex_init(&w->m, NULL);
    pthread_cond_init(&w->c, NULL);
    w->done = 0;
    w->status = PMIX_SUCCESS;
}

static void op_done(pmix_status_t status, void *cbdata)
{
    waiter_t *w = cbdata;
    pthread_mutex_lock(&w->m);
    if (!w->done) {
        w->status = status;
        w->done = 1;
        pthread_cond_broadcast(&w->c);
    }
    pthread_mutex_unlock(&w->m);
}

/* A waiter the library may complete after its caller stopped waiting (a timeout, or a
 * tool's notification, which 4.2 completes twice): it lives on the heap, so a late
 * completion finds it, and is freed only when nothing more can come. */
static waiter_t *waiter_new(void)
{
    waiter_t *w = calloc(1, sizeof *w);
    if (!w)
        die(1, "out of memory");
    waiter_init(w);
    return w;
}

/* The operation's status, or PMIX_ERR_TIMEOUT after `secs`. */
static pmix_status_t waiter_wait(waiter_t *w, int secs)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += secs;
    pthread_mutex_lock(&w->m);
    while (!w->done)
        if (pthread_cond_timedwait(&w->c, &w->m, &until) == ETIMEDOUT)
            break;
    pmix_status_t st = w->done ? w->status : PMIX_ERR_TIMEOUT;
    pthread_mutex_unlock(&w->m);
    return st;
}

/* A started operation's outcome: at once, or through its callback. */
static pmix_status_t settle(pmix_status_t rc, waiter_t *w, int secs)
{
    if (rc == PMIX_SUCCESS)
        return waiter_wait(w, secs);
    return rc == PMIX_OPERATION_SUCCEEDED ? PMIX_SUCCESS : rc;
}

static json_object *proc_json(const pmix_proc_t *p)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "nspace", json_object_new_string(p->nspace));
    json_object_object_add(o, "rank", json_object_new_int64(p->rank));
    return o;
}

static json_object *value_json(const pmix_value_t *v)
{
    switch (v->type) {
    case PMIX_STRING:
        return json_object_new_string(v->data.string ? v->data.string : "");
    case PMIX_BOOL:
        return json_object_new_boolean(v->data.flag);
    case PMIX_INT:
        return json_object_new_int64(v->data.integer);
    case PMIX_INT32:
        return json_object_new_int64(v->data.int32);
    case PMIX_INT64:
        return json_object_new_int64(v->data.int64);
    case PMIX_UINT32:
        return json_object_new_int64(v->data.uint32);
    case PMIX_UINT64:
        return json_object_new_int64((int64_t) v->data.uint64);
    case PMIX_SIZE:
        return json_object_new_int64((int64_t) v->data.size);
    case PMIX_PID:
        return json_object_new_int64(v->data.pid);
    case PMIX_STATUS:
        return json_object_new_int64(v->data.status);
    case PMIX_PROC_RANK:
        return json_object_new_int64(v->data.rank);
    case PMIX_PROC:
        return proc_json(v->data.proc);
    default: {
        char buf[64];
        snprintf(buf, sizeof buf, "<%s>", PMIx_Data_type_string(v->type));
        return json_object_new_string(buf);
    }
    }
}

static json_object *kv_json(const char *key, json_object *value)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "key", json_object_new_string(key));
    json_object_object_add(o, "value", value);
    return o;
}

/* Loads `value` (JSON) into `info` under `key`: integers as PMIX_INT64, booleans, anything
 * else as its JSON text (strings without quotes). */
static void load_json_info(pmix_info_t *info, const char *key, json_object *value)
{
    if (json_object_is_type(value, json_type_int)) {
        int64_t n = json_object_get_int64(value);
        PMIX_INFO_LOAD(info, key, &n, PMIX_INT64);
    } else if (json_object_is_type(value, json_type_boolean)) {
        bool b = json_object_get_boolean(value);
        PMIX_INFO_LOAD(info, key, &b, PMIX_BOOL);
    } else {
        const char *s = json_object_is_type(value, json_type_string)
                            ? json_object_get_string(value)
                            : json_object_to_json_string_ext(value, JSON_C_TO_STRING_PLAIN);
        PMIX_INFO_LOAD(info, key, s, PMIX_STRING);
    }
}

static pmix_data_range_t parse_range(const char *s)
{
    static const struct {
        const char *name;
        pmix_data_range_t r;
    } ranges[] = {
        {"UNDEF", PMIX_RANGE_UNDEF},       {"RM", PMIX_RANGE_RM},
        {"LOCAL", PMIX_RANGE_LOCAL},       {"NAMESPACE", PMIX_RANGE_NAMESPACE},
        {"SESSION", PMIX_RANGE_SESSION},   {"GLOBAL", PMIX_RANGE_GLOBAL},
        {"CUSTOM", PMIX_RANGE_CUSTOM},     {"PROC_LOCAL", PMIX_RANGE_PROC_LOCAL},
    };
    const char *bare = strncasecmp(s, "PMIX_RANGE_", 11) == 0 ? s + 11 : s;
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (strcasecmp(bare, ranges[i].name) == 0)
            return ranges[i].r;
    die(2, "range %s: not a PMIx range", s);
    return PMIX_RANGE_UNDEF;
}

/* NSPACE:RANK into `p`. */
static void parse_proc(const char *s, pmix_proc_t *p)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        die(2, "target %s: expected NSPACE:RANK", s);
    char ns[PMIX_MAX_NSLEN + 1];
    snprintf(ns, sizeof ns, "%.*s", (int) (colon - s), s);
    char *end;
    errno = 0;
    unsigned long r = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || colon[1] == '-' || r > INT32_MAX)
        die(2, "target %s: the rank is not a process rank", s);
    PMIX_LOAD_PROCID(p, ns, (pmix_rank_t) r);
}

static const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
        die(2, "%s needs a value", argv[*i]);
    return argv[++*i];
}

/* ============================== server ============================== */

#define SERVER_NSPACE "pmix-adapter-server"
static volatile sig_atomic_t stopping;
static int jobs_registered;

static pmix_status_t up_client_connected(const pmix_proc_t *p, void *s, pmix_info_t *info,
                                         size_t ninfo, pmix_op_cbfunc_t cb, void *cbdata)
{
    (void) p, (void) s, (void) info, (void) ninfo, (void) cb, (void) cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t up_client_finalized(const pmix_proc_t *p, void *s, pmix_op_cbfunc_t cb,
                                         void *cbdata)
{
    (void) p, (void) s, (void) cb, (void) cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t up_abort(const pmix_proc_t *p, void *s, int status, const char msg[],
                              pmix_proc_t procs[], size_t nprocs, pmix_op_cbfunc_t cb,
                              void *cbdata)
{
    (void) s, (void) procs, (void) nprocs, (void) cb, (void) cbdata;
    fprintf(stderr, "pmix-adapter: %s:%u aborted (%d): %s\n", p->nspace, p->rank, status,
            msg ? msg : "");
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t up_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                              size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cb,
                              void *cbdata)
{
    (void) procs, (void) nprocs, (void) info, (void) ninfo;
    /* Every participant is on this one node: the data is complete already. */
    if (cb)
        cb(PMIX_SUCCESS, data, ndata, cbdata, NULL, NULL);
    return PMIX_SUCCESS;
}

/* The library delivered to this node's clients before calling up: a one-node host has no
 * other node to carry the event to. It must answer at once: the library frees what it
 * passed when this returns (calling back later uses freed memory in 4.2). */
static pmix_status_t up_notify(pmix_status_t code, const pmix_proc_t *source,
                               pmix_data_range_t range, pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cb, void *cbdata)
{
    (void) info, (void) ninfo, (void) cb, (void) cbdata;
    fprintf(stderr, "pmix-adapter: event %d from %s:%u, range %s, for the host\n", code,
            source ? source->nspace : "?", source ? source->rank : 0,
            PMIx_Data_range_string(range));
    return PMIX_OPERATION_SUCCEEDED;
}

static void up_tool_connected(pmix_info_t *info, size_t ninfo, pmix_tool_connection_cbfunc_t cb,
                              void *cbdata)
{
    static int tools;
    pmix_proc_t p;
    char ns[PMIX_MAX_NSLEN + 1];
    snprintf(ns, sizeof ns, "tool%d", ++tools);
    PMIX_LOAD_PROCID(&p, ns, 0);
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_NSPACE) && info[i].value.type == PMIX_STRING)
            PMIX_LOAD_NSPACE(p.nspace, info[i].value.data.string);
    if (cb)
        cb(PMIX_SUCCESS, &p, cbdata);
}

static pmix_status_t up_register_events(pmix_status_t *codes, size_t ncodes,
                                        const pmix_info_t info[], size_t ninfo,
                                        pmix_op_cbfunc_t cb, void *cbdata)
{
    (void) codes, (void) ncodes, (void) info, (void) ninfo, (void) cb, (void) cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t up_deregister_events(pmix_status_t *codes, size_t ncodes,
                                          pmix_op_cbfunc_t cb, void *cbdata)
{
    (void) codes, (void) ncodes, (void) cb, (void) cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static void write_all(int fd, const char *fmt, ...)
{
    char *buf;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&buf, fmt, ap);
    va_end(ap);
    for (int off = 0; n > 0 && off < n;) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += w;
    }
    if (n >= 0)
        free(buf);
}

/* Registers a namespace of `n` processes of user `uid` and writes each one's environment. */
static void register_job(int fd, int n, uid_t uid, gid_t gid)
{
    if (n < 1 || n > MAX_PROCS) {
        write_all(fd, "ERR a job has 1 to %d processes, not %d\n", MAX_PROCS, n);
        return;
    }
    char ns[PMIX_MAX_NSLEN + 1], host[256] = "localhost", peers[MAX_PROCS * 4] = "";
    snprintf(ns, sizeof ns, "job%d", ++jobs_registered);
    gethostname(host, sizeof host - 1);
    for (int r = 0; r < n; r++)
        snprintf(peers + strlen(peers), sizeof peers - strlen(peers), "%s%d", r ? "," : "", r);
    char *node_map = NULL, *proc_map = NULL;
    if (PMIx_generate_regex(host, &node_map) != PMIX_SUCCESS ||
        PMIx_generate_ppn(peers, &proc_map) != PMIX_SUCCESS || !node_map || !proc_map) {
        write_all(fd, "ERR the library cannot describe node %s's processes\n", host);
        free(node_map);
        free(proc_map);
        return;
    }
    uint32_t size = n, appnum = 0;
    pmix_info_t info[7];
    PMIX_INFO_LOAD(&info[0], PMIX_UNIV_SIZE, &size, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[1], PMIX_JOB_SIZE, &size, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[2], PMIX_LOCAL_SIZE, &size, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[3], PMIX_LOCAL_PEERS, peers, PMIX_STRING);
    PMIX_INFO_LOAD(&info[4], PMIX_NODE_MAP, node_map, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[5], PMIX_PROC_MAP, proc_map, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[6], PMIX_APPNUM, &appnum, PMIX_UINT32);
    /* Completed once; kept (not freed) only if it timed out and may still complete. */
    waiter_t *w = waiter_new();
    pmix_status_t rc = settle(PMIx_server_register_nspace(ns, n, info, 7, op_done, w), w, 10);
    if (rc != PMIX_ERR_TIMEOUT)
        free(w);
    free(node_map);
    free(proc_map);
    if (rc != PMIX_SUCCESS) {
        write_all(fd, "ERR registering namespace %s: %s\n", ns, PMIx_Error_string(rc));
        return;
    }
    write_all(fd, "NSPACE %s\n", ns);
    for (int r = 0; r < n; r++) {
        pmix_proc_t p;
        PMIX_LOAD_PROCID(&p, ns, r);
        w = waiter_new();
        rc = settle(PMIx_server_register_client(&p, uid, gid, NULL, op_done, w), w, 10);
        if (rc != PMIX_ERR_TIMEOUT)
            free(w);
        char **env = calloc(1, sizeof(char *));
        if (rc == PMIX_SUCCESS)
            rc = PMIx_server_setup_fork(&p, &env);
        if (rc != PMIX_SUCCESS) {
            write_all(fd, "ERR preparing %s:%d: %s\n", ns, r, PMIx_Error_string(rc));
            return;
        }
        write_all(fd, "RANK %d\n", r);
        for (char **e = env; *e; e++) {
            write_all(fd, "ENV %s\n", *e);
            free(*e);
        }
        free(env);
    }
    write_all(fd, "DONE\n");
}

static void on_term(int sig)
{
    (void) sig;
    stopping = 1;
}

static int control_socket(const char *dir, int listening)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if ((size_t) snprintf(a.sun_path, sizeof a.sun_path, "%s/control", dir) >= sizeof a.sun_path)
        die(1, "--dir %s: too long for a socket path", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die(1, "socket: %s", strerror(errno));
    if (listening) {
        unlink(a.sun_path);
        if (bind(fd, (struct sockaddr *) &a, sizeof a) < 0 || listen(fd, 64) < 0)
            die(1, "serving %s: %s", a.sun_path, strerror(errno));
    } else if (connect(fd, (struct sockaddr *) &a, sizeof a) < 0) {
        die(3, "no server at %s: %s", a.sun_path, strerror(errno));
    }
    return fd;
}

static int server_main(const char *dir)
{
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        die(1, "--dir %s: %s", dir, strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    pmix_server_module_t module = {
        .client_connected2 = up_client_connected,
        .client_finalized = up_client_finalized,
        .abort = up_abort,
        .fence_nb = up_fence,
        .notify_event = up_notify,
        .tool_connected = up_tool_connected,
        .register_events = up_register_events,
        .deregister_events = up_deregister_events,
    };
    bool yes = true;
    pmix_rank_t zero = 0;
    pmix_info_t info[6];
    PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TOOL_SUPPORT, &yes, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_SERVER_TMPDIR, dir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[2], PMIX_SYSTEM_TMPDIR, dir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[3], PMIX_SERVER_NSPACE, SERVER_NSPACE, PMIX_STRING);
    PMIX_INFO_LOAD(&info[4], PMIX_SERVER_RANK, &zero, PMIX_PROC_RANK);
    /* The system server's rendezvous file in --dir is how tools find it. */
    PMIX_INFO_LOAD(&info[5], PMIX_SERVER_SYSTEM_SUPPORT, &yes, PMIX_BOOL);
    pmix_status_t rc = PMIx_server_init(&module, info, 6);
    if (rc != PMIX_SUCCESS)
        die(1, "PMIx_server_init: %s", PMIx_Error_string(rc));
    int ls = control_socket(dir, 1);
    json_object *ready = json_object_new_object();
    json_object_object_add(ready, "ready", json_object_new_boolean(1));
    json_object_object_add(ready, "pmix", json_object_new_string(PMIx_Get_version()));
    emit(ready);
    while (!stopping) {
        struct pollfd p = {ls, POLLIN, 0};
        if (poll(&p, 1, 200) <= 0)
            continue;
        int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        /* A runner that connects and says nothing holds the server up for 5 s at most. */
        struct timeval five = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five);
        struct ucred cred;
        socklen_t len = sizeof cred;
        char line[64] = "";
        size_t n = 0;
        while (n + 1 < sizeof line && read(fd, line + n, 1) == 1 && line[n] != '\n')
            n++;
        line[n] = 0;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
            write_all(fd, "ERR cannot learn the runner's user\n");
        else if (strncmp(line, "JOB ", 4) == 0)
            register_job(fd, atoi(line + 4), cred.uid, cred.gid);
        else
            write_all(fd, "ERR unknown request %s\n", line);
        close(fd);
    }
    PMIx_server_finalize();
    return 0;
}

/* ============================== runner ============================== */

static int run_main(const char *dir, int n, char **cmd)
{
    int fd = control_socket(dir, 0);
    write_all(fd, "JOB %d\n", n);
    FILE *f = fdopen(fd, "r");
    char line[8192];
    char **env[MAX_PROCS] = {0};
    int nenv[MAX_PROCS] = {0}, rank = -1, done = 0;
    while (!done && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "ERR ", 4) == 0)
            die(3, "the server: %s", line + 4);
        if (strncmp(line, "RANK ", 5) == 0) {
            rank = atoi(line + 5);
        } else if (strncmp(line, "ENV ", 4) == 0 && rank >= 0 && rank < n) {
            char **grown = realloc(env[rank], sizeof(char *) * (nenv[rank] + 2));
            if (!grown)
                die(1, "out of memory");
            env[rank] = grown;
            env[rank][nenv[rank]++] = strdup(line + 4);
            env[rank][nenv[rank]] = NULL;
        } else if (strcmp(line, "DONE") == 0) {
            done = 1;
        }
    }
    fclose(f);
    if (!done)
        die(3, "the server did not register the job");
    pid_t pids[MAX_PROCS];
    struct pollfd out[MAX_PROCS];
    char *pending[MAX_PROCS] = {0};
    size_t plen[MAX_PROCS] = {0};
    for (int r = 0; r < n; r++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
            die(1, "pipe: %s", strerror(errno));
        pids[r] = fork();
        if (pids[r] < 0)
            die(1, "fork: %s", strerror(errno));
        if (pids[r] == 0) {
            dup2(p[1], 1);
            for (int k = 0; k < nenv[r]; k++)
                putenv(env[r][k]);
            execvp(cmd[0], cmd);
            fprintf(stderr, "pmix-adapter: %s: %s\n", cmd[0], strerror(errno));
            _exit(127);
        }
        close(p[1]);
        out[r] = (struct pollfd){p[0], POLLIN, 0};
    }
    for (int open = n; open > 0;) {
        if (poll(out, n, -1) < 0 && errno != EINTR)
            break;
        for (int r = 0; r < n; r++) {
            if (out[r].fd < 0 || !out[r].revents)
                continue;
            char buf[4096];
            ssize_t k = read(out[r].fd, buf, sizeof buf);
            if (k <= 0) {
                if (plen[r])
                    printf("[%d] %.*s\n", r, (int) plen[r], pending[r]);
                close(out[r].fd);
                out[r].fd = -1;
                open--;
                continue;
            }
            /* A line longer than 1 MiB is passed on in pieces: the runner holds no more. */
            if (plen[r] + k > (1 << 20)) {
                printf("[%d] %.*s\n", r, (int) plen[r], pending[r]);
                plen[r] = 0;
            }
            char *grown = realloc(pending[r], plen[r] + k);
            if (!grown)
                die(1, "out of memory");
            pending[r] = grown;
            memcpy(pending[r] + plen[r], buf, k);
            plen[r] += k;
            char *nl;
            while ((nl = memchr(pending[r], '\n', plen[r]))) {
                size_t len = nl - pending[r];
                printf("[%d] %.*s\n", r, (int) len, pending[r]);
                memmove(pending[r], nl + 1, plen[r] - len - 1);
                plen[r] -= len + 1;
            }
            fflush(stdout);
        }
    }
    int worst = 0;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code > worst)
            worst = code;
    }
    return worst;
}

/* ============================== client or tool ============================== */

static pmix_proc_t me;
static int is_tool;

static void connect_pmix(const char *dir)
{
    pmix_status_t rc;
    if (getenv("PMIX_NAMESPACE")) {
        rc = PMIx_Init(&me, NULL, 0);
    } else {
        if (!dir)
            die(2, "a tool needs --dir (where the server is)");
        is_tool = 1;
        bool yes = true;
        pmix_info_t info[3];
        PMIX_INFO_LOAD(&info[0], PMIX_SYSTEM_TMPDIR, dir, PMIX_STRING);
        PMIX_INFO_LOAD(&info[1], PMIX_SERVER_TMPDIR, dir, PMIX_STRING);
        PMIX_INFO_LOAD(&info[2], PMIX_CONNECT_TO_SYSTEM, &yes, PMIX_BOOL);
        rc = PMIx_tool_init(&me, info, 3);
    }
    if (rc != PMIX_SUCCESS)
        die(3, "%s: %s", is_tool ? "PMIx_tool_init" : "PMIx_Init", PMIx_Error_string(rc));
}

/* The contract's "me": the job process, or null for a tool. */
static json_object *me_json(void)
{
    return is_tool ? NULL : proc_json(&me);
}

/* ============================== listener ============================== */

typedef struct {
    char name[PMIX_MAX_KEYLEN + 1];
    int named;
    pmix_status_t codes[MAX_ITEMS];
    size_t ncodes;
    pmix_status_t returns;
    const char *returns_name;
    int prepend, deregister, rank;
    long delay_ms, register_delay_ms;
    pmix_info_t results[MAX_ITEMS];
    size_t nresults;
    int mine; /* registered by this listener (its rank, if it names one) */
    size_t id;          /* written by the main thread once registered... */
    int registered;     /* ...then this is set (both read with atomics by handler calls) */
    int dereg_pending;  /* called before its id was known: the main thread deregisters it */
} handler_t;

typedef struct {
    pmix_status_t code;
    pmix_data_range_t range;
    pmix_proc_t targets[MAX_ITEMS];
    size_t ntargets;
    pmix_info_t info[MAX_ITEMS];
    size_t ninfo;
    int rank, has_on;
    pmix_status_t on;
    long after_ms;
    volatile int due; /* times it is to be sent (raised by handler calls for `on`) */
} note_t;

static handler_t handlers[MAX_HANDLERS];
static int nhandlers;
static note_t notes[MAX_NOTES];
static int nnotes;

static const struct {
    const char *name;
    pmix_status_t status;
} completions[] = {
    {"NO_ACTION_TAKEN", PMIX_EVENT_NO_ACTION_TAKEN},
    {"PARTIAL_ACTION_TAKEN", PMIX_EVENT_PARTIAL_ACTION_TAKEN},
    {"ACTION_DEFERRED", PMIX_EVENT_ACTION_DEFERRED},
    {"ACTION_COMPLETE", PMIX_EVENT_ACTION_COMPLETE},
};

/* The chain file's values, each of the type its key needs or a clear error naming the
 * entry and key. */
static int64_t want_int(json_object *v, int i, const char *key, int64_t min, int64_t max)
{
    if (!json_object_is_type(v, json_type_int))
        die(2, "entry %d: %s must be a whole number", i, key);
    errno = 0;
    int64_t n = json_object_get_int64(v);
    if (errno || n < min || n > max)
        die(2, "entry %d: %s must be from %lld to %lld", i, key, (long long) min,
            (long long) max);
    return n;
}

static const char *want_str(json_object *v, int i, const char *key)
{
    if (!json_object_is_type(v, json_type_string))
        die(2, "entry %d: %s must be a string", i, key);
    return json_object_get_string(v);
}

static int want_bool(json_object *v, int i, const char *key)
{
    if (!json_object_is_type(v, json_type_boolean))
        die(2, "entry %d: %s must be true or false", i, key);
    return json_object_get_boolean(v);
}

static size_t want_array(json_object *v, int i, const char *key, size_t max)
{
    if (!json_object_is_type(v, json_type_array))
        die(2, "entry %d: %s must be an array", i, key);
    size_t n = json_object_array_length(v);
    if (n > max)
        die(2, "entry %d: %s has %zu elements (at most %zu)", i, key, n, max);
    return n;
}

/* A {"key", "value"} object into `info`. */
static void want_kv(json_object *r, int i, const char *key, pmix_info_t *info)
{
    json_object *rk, *rv;
    if (!json_object_is_type(r, json_type_object) || !json_object_object_get_ex(r, "key", &rk) ||
        !json_object_object_get_ex(r, "value", &rv))
        die(2, "entry %d: each of %s is {\"key\", \"value\"}", i, key);
    const char *k = want_str(rk, i, "a key");
    if (strlen(k) > PMIX_MAX_KEYLEN)
        die(2, "entry %d: key %s is longer than PMIx's %d", i, k, PMIX_MAX_KEYLEN);
    load_json_info(info, k, rv);
}

/* Delays are bounded: a listener lives for --timeout at most anyway. */
#define MAX_DELAY_MS 3600000

static void parse_handler(json_object *h, int i)
{
    handler_t *d = &handlers[nhandlers++];
    memset(d, 0, sizeof *d);
    d->returns = PMIX_EVENT_NO_ACTION_TAKEN;
    d->returns_name = "NO_ACTION_TAKEN";
    d->rank = -1;
    json_object_object_foreach(h, key, v)
    {
        if (strcmp(key, "name") == 0) {
            const char *n = want_str(v, i, key);
            if (strlen(n) >= sizeof d->name)
                die(2, "entry %d: name %s is longer than %zu bytes", i, n, sizeof d->name - 1);
            snprintf(d->name, sizeof d->name, "%s", n);
            d->named = 1;
        } else if (strcmp(key, "codes") == 0) {
            size_t n = want_array(v, i, key, MAX_ITEMS);
            for (size_t k = 0; k < n; k++)
                d->codes[d->ncodes++] = (pmix_status_t) want_int(
                    json_object_array_get_idx(v, k), i, "a code", INT32_MIN, INT32_MAX);
        } else if (strcmp(key, "status") == 0) {
            const char *st = want_str(v, i, key);
            const char *bare = strncmp(st, "PMIX_EVENT_", 11) == 0 ? st + 11 : st;
            size_t k = 0;
            while (k < 4 && strcmp(bare, completions[k].name) != 0)
                k++;
            if (k == 4)
                die(2, "entry %d: status %s is not a handler status", i, st);
            d->returns = completions[k].status;
            d->returns_name = completions[k].name;
        } else if (strcmp(key, "job_level") == 0 || strcmp(key, "enviro_level") == 0) {
            want_bool(v, i, key);
            /* PMIx 4.2 has neither PMIX_EVENT_JOB_LEVEL nor PMIX_EVENT_ENVIRO_LEVEL: the
             * library decides a code's level itself. The directive is dropped. */
            fprintf(stderr, "pmix-adapter: entry %d: %s has no PMIx %s attribute; dropped\n",
                    i, key, PMIx_Get_version());
        } else if (strcmp(key, "prepend") == 0) {
            d->prepend = want_bool(v, i, key);
        } else if (strcmp(key, "results") == 0) {
            size_t n = want_array(v, i, key, MAX_ITEMS);
            for (size_t k = 0; k < n; k++)
                want_kv(json_object_array_get_idx(v, k), i, key, &d->results[d->nresults++]);
        } else if (strcmp(key, "delay_ms") == 0) {
            d->delay_ms = want_int(v, i, key, 0, MAX_DELAY_MS);
        } else if (strcmp(key, "register_delay_ms") == 0) {
            d->register_delay_ms = want_int(v, i, key, 0, MAX_DELAY_MS);
        } else if (strcmp(key, "deregister") == 0) {
            d->deregister = want_bool(v, i, key);
        } else if (strcmp(key, "rank") == 0) {
            d->rank = (int) want_int(v, i, key, 0, INT32_MAX);
        } else {
            die(2, "entry %d: unknown handler key %s", i, key);
        }
    }
}

static void parse_note(json_object *n, int i)
{
    if (nnotes == MAX_NOTES)
        die(2, "at most %d notifications in a chain", MAX_NOTES);
    if (!json_object_is_type(n, json_type_object))
        die(2, "entry %d: notify must be an object", i);
    note_t *d = &notes[nnotes++];
    memset(d, 0, sizeof *d);
    d->rank = -1;
    d->range = PMIX_RANGE_SESSION;
    int have_code = 0;
    json_object_object_foreach(n, key, v)
    {
        if (strcmp(key, "code") == 0) {
            d->code = (pmix_status_t) want_int(v, i, key, INT32_MIN, INT32_MAX);
            have_code = 1;
        } else if (strcmp(key, "range") == 0) {
            d->range = parse_range(want_str(v, i, key));
        } else if (strcmp(key, "targets") == 0) {
            size_t len = want_array(v, i, key, MAX_ITEMS);
            for (size_t k = 0; k < len; k++) {
                json_object *t = json_object_array_get_idx(v, k), *ns, *rk;
                if (!json_object_object_get_ex(t, "nspace", &ns) ||
                    !json_object_object_get_ex(t, "rank", &rk))
                    die(2, "entry %d: a target is {\"nspace\", \"rank\"}", i);
                const char *nspace = want_str(ns, i, "a target's nspace");
                if (strlen(nspace) > PMIX_MAX_NSLEN)
                    die(2, "entry %d: namespace %s is longer than PMIx's %d", i, nspace,
                        PMIX_MAX_NSLEN);
                PMIX_LOAD_PROCID(&d->targets[d->ntargets++], nspace,
                                 (pmix_rank_t) want_int(rk, i, "a target's rank", 0, INT32_MAX));
            }
        } else if (strcmp(key, "info") == 0) {
            size_t len = want_array(v, i, key, MAX_ITEMS - 1);
            for (size_t k = 0; k < len; k++)
                want_kv(json_object_array_get_idx(v, k), i, key, &d->info[d->ninfo++]);
        } else if (strcmp(key, "rank") == 0) {
            d->rank = (int) want_int(v, i, key, 0, INT32_MAX);
        } else if (strcmp(key, "after_ms") == 0) {
            d->after_ms = want_int(v, i, key, 0, MAX_DELAY_MS);
        } else if (strcmp(key, "on") == 0) {
            d->on = (pmix_status_t) want_int(v, i, key, INT32_MIN, INT32_MAX);
            d->has_on = 1;
        } else {
            die(2, "entry %d: unknown notification key %s", i, key);
        }
    }
    if (!have_code)
        die(2, "entry %d: a notification needs a code", i);
}

static void load_chain(const char *path)
{
    json_object *chain = json_object_from_file(path);
    if (!chain || !json_object_is_type(chain, json_type_array))
        die(2, "--chain %s: not a JSON array (%s)", path, json_util_get_last_err());
    size_t n = json_object_array_length(chain);
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(chain, i), *note;
        if (!json_object_is_type(e, json_type_object))
            die(2, "--chain %s: entry %zu is not an object", path, i);
        if (json_object_object_get_ex(e, "notify", &note)) {
            if (json_object_object_length(e) != 1)
                die(2, "--chain %s: entry %zu: a notification has nothing beside \"notify\"",
                    path, i);
            parse_note(note, (int) i);
        }
        else if (nhandlers < MAX_HANDLERS)
            parse_handler(e, (int) i);
        else
            die(2, "--chain %s: at most %d handlers", path, MAX_HANDLERS);
    }
    json_object_put(chain);
}

static void nothing_to_release(pmix_status_t status, void *cbdata)
{
    (void) status, (void) cbdata;
}

typedef struct {
    handler_t *h;
    pmix_event_notification_cbfunc_fn_t done;
    void *cbdata;
} later_t;

static void *complete_later(void *arg)
{
    later_t *l = arg;
    sleep_ms(l->h->delay_ms);
    l->done(l->h->returns, l->h->results, l->h->nresults, nothing_to_release, NULL, l->cbdata);
    free(l);
    return NULL;
}

static void deregistered(pmix_status_t status, void *cbdata)
{
    (void) status, (void) cbdata;
}

/* PMIx 4.2's flat results list in the contract's shape: a status-typed entry begins an
 * earlier handler's entry (keyed by its name, its status first); what follows, until the
 * next one, are that handler's results. */
static json_object *results_json(const pmix_info_t *r, size_t n)
{
    json_object *all = json_object_new_array(), *cur = NULL;
    for (size_t i = 0; i < n; i++) {
        json_object *kv = kv_json(r[i].key, value_json(&r[i].value));
        if (r[i].value.type == PMIX_STATUS || !cur) {
            cur = json_object_new_array();
            json_object_array_add(all, kv_json(r[i].key, cur));
        }
        json_object_array_add(cur, kv);
    }
    return all;
}

static void on_event(size_t id, pmix_status_t code, const pmix_proc_t *source, pmix_info_t info[],
                     size_t ninfo, pmix_info_t *results, size_t nresults,
                     pmix_event_notification_cbfunc_fn_t done, void *cbdata)
{
    /* Cached events are replayed while a registration is made, before its id is known: the
     * handler's name (the library hands it back in the info) says which one this is. */
    handler_t *h = NULL;
    for (size_t k = 0; k < ninfo && !h; k++)
        if (PMIX_CHECK_KEY(&info[k], PMIX_EVENT_HDLR_NAME) && info[k].value.type == PMIX_STRING)
            for (int i = 0; i < nhandlers && !h; i++)
                if (handlers[i].mine && handlers[i].named &&
                    strcmp(handlers[i].name, info[k].value.data.string) == 0)
                    h = &handlers[i];
    for (int i = 0; i < nhandlers && !h; i++)
        if (handlers[i].mine && __atomic_load_n(&handlers[i].registered, __ATOMIC_ACQUIRE) &&
            handlers[i].id == id)
            h = &handlers[i];
    int64_t at = unix_us();
    json_object *line = json_object_new_object();
    json_object_object_add(line, "handler", json_object_new_string(h ? h->name : ""));
    json_object_object_add(line, "at_us", json_object_new_int64(at));
    json_object_object_add(line, "id", json_object_new_int64((int64_t) id));
    json_object_object_add(line, "code", json_object_new_int64(code));
    json_object_object_add(line, "source", source ? proc_json(source) : NULL);
    json_object *inf = json_object_new_array();
    for (size_t k = 0; k < ninfo; k++)
        json_object_array_add(inf, kv_json(info[k].key, value_json(&info[k].value)));
    json_object_object_add(line, "info", inf);
    json_object_object_add(line, "results", results_json(results, nresults));
    json_object_object_add(line, "returns",
                           json_object_new_string(h ? h->returns_name : "NO_ACTION_TAKEN"));
    emit(line);
    /* Once per event: its first handler call (no earlier results) starts the chain. The
     * library does not say when the chain ends, so the note may go before it does. */
    if (nresults == 0)
        for (int i = 0; i < nnotes; i++)
            if (notes[i].has_on && notes[i].on == code)
                __atomic_add_fetch(&notes[i].due, 1, __ATOMIC_SEQ_CST);
    if (!h) {
        done(PMIX_EVENT_NO_ACTION_TAKEN, NULL, 0, NULL, NULL, cbdata);
        return;
    }
    if (h->deregister) {
        /* A cached event replayed while the registration is being made comes before its
         * id is known: the main thread deregisters it once it is. */
        if (__atomic_load_n(&h->registered, __ATOMIC_ACQUIRE))
            PMIx_Deregister_event_handler(h->id, deregistered, NULL);
        else
            __atomic_store_n(&h->dereg_pending, 1, __ATOMIC_RELEASE);
    }
    if (h->delay_ms > 0) {
        later_t *l = malloc(sizeof *l);
        *l = (later_t){h, done, cbdata};
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, complete_later, l) == 0)
            return;
        free(l);
    }
    done(h->returns, h->results, h->nresults, nothing_to_release, NULL, cbdata);
}

static void send_note(note_t *n)
{
    pmix_info_t info[MAX_ITEMS + 1];
    size_t ninfo = n->ninfo;
    memcpy(info, n->info, sizeof(pmix_info_t) * n->ninfo);
    pmix_data_array_t targets = {.type = PMIX_PROC, .size = n->ntargets, .array = n->targets};
    if (n->ntargets)
        PMIX_INFO_LOAD(&info[ninfo++], PMIX_EVENT_CUSTOM_RANGE, &targets, PMIX_DATA_ARRAY);
    /* Never freed: a tool's notification completes twice in 4.2 (one per note sent). */
    waiter_t *w = waiter_new();
    int64_t sent = unix_us();
    pmix_status_t rc = settle(PMIx_Notify_event(n->code, NULL, n->range, info, ninfo, op_done, w),
                              w, 10);
    json_object *line = json_object_new_object();
    json_object_object_add(line, "notified", json_object_new_int64(n->code));
    json_object_object_add(line, "sent_us", json_object_new_int64(sent));
    json_object_object_add(line, "range", json_object_new_string(PMIx_Data_range_string(n->range)));
    json_object_object_add(line, "status", json_object_new_string(PMIx_Error_string(rc)));
    emit(line);
}

static int listen_main(const char *dir, const char *chain, double timeout)
{
    if (chain)
        load_chain(chain);
    if (nhandlers == 0)
        die(2, "listen needs a --chain with at least one handler");
    double deadline = now() + timeout;
    connect_pmix(dir);
    json_object *c = json_object_new_object();
    json_object_object_add(c, "connected", json_object_new_boolean(1));
    json_object_object_add(c, "me", me_json());
    emit(c);
    json_object *regs = json_object_new_array();
    for (int i = 0; i < nhandlers; i++) {
        handler_t *h = &handlers[i];
        if (h->rank >= 0 && (is_tool || (pmix_rank_t) h->rank != me.rank))
            continue;
        h->mine = 1;
        if (h->register_delay_ms > 0)
            sleep_ms(h->register_delay_ms);
        if (now() >= deadline)
            _exit(0);
        bool yes = true;
        pmix_info_t info[2];
        size_t ninfo = 0;
        if (h->named)
            PMIX_INFO_LOAD(&info[ninfo++], PMIX_EVENT_HDLR_NAME, h->name, PMIX_STRING);
        if (h->prepend)
            PMIX_INFO_LOAD(&info[ninfo++], PMIX_EVENT_HDLR_PREPEND, &yes, PMIX_BOOL);
        /* Without a callback the registration is made before this returns: its id, or an
         * error (negative). */
        pmix_status_t rc = PMIx_Register_event_handler(h->ncodes ? h->codes : NULL, h->ncodes,
                                                       info, ninfo, on_event, NULL, NULL);
        if (rc < 0)
            die(3, "registering handler %s: %s", h->name, PMIx_Error_string(rc));
        h->id = (size_t) rc;
        __atomic_store_n(&h->registered, 1, __ATOMIC_RELEASE);
        if (__atomic_load_n(&h->dereg_pending, __ATOMIC_ACQUIRE))
            PMIx_Deregister_event_handler(h->id, deregistered, NULL);
        json_object *r = json_object_new_object();
        json_object_object_add(r, "id", json_object_new_int64(rc));
        json_object_object_add(r, "name", h->named ? json_object_new_string(h->name) : NULL);
        json_object_array_add(regs, r);
    }
    json_object *ready = json_object_new_object();
    json_object_object_add(ready, "ready", json_object_new_boolean(1));
    json_object_object_add(ready, "me", me_json());
    json_object_object_add(ready, "registrations", regs);
    emit(ready);
    double since = now();
    int sent_once[MAX_NOTES] = {0};
    while (now() < deadline) {
        for (int i = 0; i < nnotes; i++) {
            note_t *n = &notes[i];
            if (n->rank >= 0 && (is_tool || (pmix_rank_t) n->rank != me.rank))
                continue;
            if (n->has_on) {
                while (__atomic_load_n(&n->due, __ATOMIC_SEQ_CST) > 0) {
                    __atomic_sub_fetch(&n->due, 1, __ATOMIC_SEQ_CST);
                    if (n->after_ms > 0)
                        sleep_ms(n->after_ms);
                    send_note(n);
                }
            } else if (!sent_once[i] && (now() - since) * 1000 >= n->after_ms) {
                sent_once[i] = 1;
                send_note(n);
            }
        }
        sleep_ms(10);
    }
    fflush(stdout);
    /* The listener's time is up; finalizing could wait on a server that is gone. */
    _exit(0);
}

/* ============================== notifier ============================== */

static int notify_main(const char *dir, int argc, char **argv)
{
    static note_t n;
    n.range = PMIX_RANGE_SESSION;
    int have_code = 0, print = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            print = 1;
        } else if (strcmp(argv[i], "--range") == 0) {
            n.range = parse_range(arg_value(argc, argv, &i));
        } else if (strcmp(argv[i], "--target") == 0) {
            if (n.ntargets == MAX_ITEMS)
                die(2, "at most %d targets", MAX_ITEMS);
            parse_proc(arg_value(argc, argv, &i), &n.targets[n.ntargets++]);
        } else if (strcmp(argv[i], "--info") == 0) {
            const char *kv = arg_value(argc, argv, &i);
            const char *eq = strchr(kv, '=');
            if (!eq || n.ninfo == MAX_ITEMS - 1)
                die(2, "--info %s: expected KEY=VALUE (at most %d)", kv, MAX_ITEMS - 1);
            char key[PMIX_MAX_KEYLEN + 1];
            snprintf(key, sizeof key, "%.*s", (int) (eq - kv), kv);
            json_object *v = json_tokener_parse(eq + 1);
            if (!v)
                v = json_object_new_string(eq + 1);
            load_json_info(&n.info[n.ninfo++], key, v);
            json_object_put(v);
        } else if (!have_code) {
            char *end;
            errno = 0;
            long code = strtol(argv[i], &end, 10);
            if (!argv[i][0] || *end || errno || code < INT32_MIN || code > INT32_MAX)
                die(2, "%s: the code must be a number", argv[i]);
            n.code = (pmix_status_t) code;
            have_code = 1;
        } else {
            die(2, "unexpected argument %s", argv[i]);
        }
    }
    if (!have_code)
        die(2, "notify needs a CODE");
    connect_pmix(dir);
    pmix_info_t info[MAX_ITEMS + 1];
    size_t ninfo = n.ninfo;
    memcpy(info, n.info, sizeof(pmix_info_t) * n.ninfo);
    pmix_data_array_t targets = {.type = PMIX_PROC, .size = n.ntargets, .array = n.targets};
    if (n.ntargets)
        PMIX_INFO_LOAD(&info[ninfo++], PMIX_EVENT_CUSTOM_RANGE, &targets, PMIX_DATA_ARRAY);
    /* A tool's notification completes twice in 4.2: the waiter takes the first, and lives
     * on (static) for the second. */
    static waiter_t w;
    waiter_init(&w);
    int64_t sent = unix_us();
    pmix_status_t rc = settle(PMIx_Notify_event(n.code, NULL, n.range, info, ninfo, op_done, &w),
                              &w, 10);
    if (print && rc == PMIX_SUCCESS)
        printf("{\"notified\":%d,\"sent_us\":%lld}\n", n.code, (long long) sent);
    if (rc != PMIX_SUCCESS)
        die(1, "notifying %d (%s): %s", n.code, PMIx_Data_range_string(n.range),
            rc == PMIX_ERR_TIMEOUT ? "the library never completed it (10 s)" : PMIx_Error_string(rc));
    if (is_tool)
        PMIx_tool_finalize();
    else
        PMIx_Finalize(NULL, 0);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        die(2, "usage: pmix-adapter server|run|listen|notify [--dir D] ...");
    const char *role = argv[1], *dir = NULL, *chain = NULL;
    double timeout = 10;
    int n = 1, rest = argc;
    char **rest_argv = NULL;
    int other = 0;
    char **others = calloc(argc, sizeof(char *));
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0) {
            dir = arg_value(argc, argv, &i);
        } else if (strcmp(role, "run") == 0 && strcmp(argv[i], "-n") == 0) {
            const char *v = arg_value(argc, argv, &i);
            char *end;
            long k = strtol(v, &end, 10);
            if (!v[0] || *end || k < 1 || k > MAX_PROCS)
                die(2, "-n %s: 1 to %d processes", v, MAX_PROCS);
            n = (int) k;
        } else if (strcmp(role, "run") == 0 && strcmp(argv[i], "--") == 0) {
            rest = i + 1;
            rest_argv = &argv[i + 1];
            break;
        } else if (strcmp(role, "listen") == 0 && strcmp(argv[i], "--chain") == 0) {
            chain = arg_value(argc, argv, &i);
        } else if (strcmp(role, "listen") == 0 && strcmp(argv[i], "--timeout") == 0) {
            const char *v = arg_value(argc, argv, &i);
            char *end;
            timeout = strtod(v, &end);
            if (!v[0] || *end || !(timeout > 0) || timeout > 86400)
                die(2, "--timeout %s: a number of seconds above 0 (at most a day)", v);
        } else {
            others[other++] = argv[i];
        }
    }
    if (strcmp(role, "server") == 0) {
        if (!dir)
            die(2, "server needs --dir");
        return server_main(dir);
    }
    if (strcmp(role, "run") == 0) {
        if (!dir || !rest_argv || rest >= argc)
            die(2, "usage: pmix-adapter run --dir D -n N -- COMMAND...");
        return run_main(dir, n, rest_argv);
    }
    if (strcmp(role, "listen") == 0) {
        if (other)
            die(2, "listen: unexpected argument %s", others[0]);
        return listen_main(dir, chain, timeout);
    }
    if (strcmp(role, "notify") == 0)
        return notify_main(dir, other, others);
    die(2, "unknown role %s (server, run, listen, notify)", role);
    return 2;
}
