package io.ckpt.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;

/**
 * Client talks to a ckpt agent over its Unix socket (protocol v1;
 * docs/protocol.md in the ckpt repository is the spec).
 *
 * <pre>{@code
 * try (Client c = Client.connect(Path.of("/run/ckpt/ckpt.sock"))) {
 *     Event done = c.checkpoint("orders-0", 42, Path.of("/data/snap-42"),
 *             new CheckpointOptions().engine("rocksdb"));
 *     System.out.println(done.getLong("checkpoint_size"));
 * }
 * }</pre>
 *
 * A Client is safe for concurrent use: each request gets a fresh id, and a
 * reader thread routes the agent's events to the request they answer;
 * events for other ids are skipped. Every call has a blocking form and an
 * asynchronous one returning a CompletableFuture. When the connection is
 * lost, the requests waiting on it fail with ConnectionLostException and
 * the next call dials again.
 */
public final class Client implements AutoCloseable {
    /** The protocol version this client speaks (the hello event's protocol). */
    public static final int PROTOCOL_VERSION = 1;
    /** The longest request line the agent reads, in bytes, without the newline. */
    public static final int MAX_LINE = 1 << 20;
    /** How long connect waits, by default, for a missing or refusing socket. */
    public static final Duration DEFAULT_DIAL_WAIT = Duration.ofSeconds(30);

    private final Path socket;
    private final Duration dialWait;
    private final AtomicLong next = new AtomicLong();
    private final Object dialLock = new Object();
    private volatile Conn conn;
    private volatile boolean closed;

    private Client(Path socket, Duration dialWait) {
        this.socket = socket;
        this.dialWait = dialWait;
    }

    /** Connects with the default dial wait; see {@link #connect(Path, Duration)}. */
    public static Client connect(Path socket) throws CkptException {
        return connect(socket, DEFAULT_DIAL_WAIT);
    }

    /**
     * Connects to the agent listening on socket. While the socket is
     * missing or refuses connections (an agent starting next to the app,
     * or restarting) it retries with backoff from 10 ms to 1 s, for at most
     * dialWait; then, or on another error, it throws ConnectFailedException.
     */
    public static Client connect(Path socket, Duration dialWait) throws CkptException {
        Client c = new Client(socket, dialWait);
        c.conn = c.dial();
        return c;
    }

    /** Closes the connection. Checkpoints past synced go on in the agent. */
    @Override
    public void close() {
        closed = true;
        Conn c = conn;
        if (c != null) {
            c.shut();
        }
    }

    // The calls: each has a blocking form and an asynchronous one.

    /** The agent's hello event: protocol (1) and version. */
    public Event hello() throws CkptException {
        return await(helloAsync(), null);
    }

    public CompletableFuture<Event> helloAsync() {
        return call("hello", new LinkedHashMap<>(), null);
    }

    /** Checkpoint n of task with no options; see the overload. */
    public Event checkpoint(String task, long n, Path dir) throws CkptException {
        return checkpoint(task, n, dir, new CheckpointOptions());
    }

    /**
     * Checkpoints n of task from the snapshot in dir (an absolute path) and
     * returns the completed event once it is in storage (checkpoint_size,
     * full_size, files_uploaded, files_reused, duration_ms). Throws
     * AgentException with the agent's code, AbortedException,
     * ConnectionLostException, or WaitTimeoutException past opts.waitFor.
     */
    public Event checkpoint(String task, long n, Path dir, CheckpointOptions opts) throws CkptException {
        return await(checkpointAsync(task, n, dir, opts), opts.waitFor);
    }

    public CompletableFuture<Event> checkpointAsync(String task, long n, Path dir, CheckpointOptions opts) {
        if (n <= 0) {
            throw new IllegalArgumentException("checkpoint number must be positive, got " + n);
        }
        if (!dir.isAbsolute()) {
            throw new IllegalArgumentException("dir must be an absolute path, got " + dir);
        }
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("task", task);
        f.put("checkpoint", n);
        f.put("dir", dir.toString());
        f.put("engine", opts.engine);
        f.put("handoff", opts.handoff);
        if (opts.timeout != null) {
            if (opts.timeout.isNegative() || opts.timeout.isZero()) {
                throw new IllegalArgumentException("timeout must be positive, got " + opts.timeout);
            }
            f.put("timeout_ms", Math.max(1, opts.timeout.toMillis()));
        }
        f.put("tasks", opts.tasks);
        f.put("job", opts.job);
        f.put("traceparent", opts.traceparent);
        if (opts.walDir != null) {
            if (!opts.walDir.isAbsolute()) {
                throw new IllegalArgumentException("walDir must be an absolute path, got " + opts.walDir);
            }
            f.put("wal_dir", opts.walDir.toString());
        }
        return call("checkpoint", f, opts.onSynced);
    }

    /**
     * Restores checkpoint n of task (0: the newest complete one) into
     * target, a missing or empty absolute path; returns the restored event
     * (restored, checkpoint, files, bytes, ...).
     */
    public Event restore(String task, Path target, long n) throws CkptException {
        return await(restoreAsync(task, target, n, false), null);
    }

    public CompletableFuture<Event> restoreAsync(String task, Path target, long n, boolean jobConsistent) {
        if (!target.isAbsolute()) {
            throw new IllegalArgumentException("target must be an absolute path, got " + target);
        }
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("task", task);
        f.put("target", target.toString());
        f.put("checkpoint", n);
        f.put("job_consistent", jobConsistent);
        return call("restore", f, null);
    }

    /** The status event: tasks lists the task named, or every task when task is null. */
    public Event status(String task) throws CkptException {
        return await(statusAsync(task), null);
    }

    public CompletableFuture<Event> statusAsync(String task) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("task", task);
        return call("status", f, null);
    }

    /** Aborts in-flight checkpoint n of task; returns the aborted event once it stopped. */
    public Event abort(String task, long n) throws CkptException {
        return await(abortAsync(task, n), null);
    }

    public CompletableFuture<Event> abortAsync(String task, long n) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("task", task);
        f.put("checkpoint", n);
        return call("abort", f, null);
    }

    /** Asks the agent to keep a warm standby copy of task; returns the following event. */
    public Event follow(String task) throws CkptException {
        return await(followAsync(task), null);
    }

    public CompletableFuture<Event> followAsync(String task) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("task", task);
        return call("follow", f, null);
    }

    // The protocol.

    /** Whether ev answers the request with id: it carries that id. */
    static boolean answers(Event ev, String id) {
        return id.equals(ev.id());
    }

    /** Whether ev is the request's last event: all are but a checkpoint's synced. */
    static boolean isFinal(String op, Event ev) {
        return !("checkpoint".equals(op) && "synced".equals(ev.name()));
    }

    /** The error the request's last event stands for, or null when it succeeded. */
    static CkptException failure(String op, Event ev) {
        if ("failed".equals(ev.name()) || "error".equals(ev.name())) {
            return AgentException.of(ev);
        }
        if ("checkpoint".equals(op) && "aborted".equals(ev.name())) {
            return new AbortedException(ev);
        }
        return null;
    }

    /** One request line: op, id and the fields that are set. */
    static byte[] encode(String op, String id, Map<String, Object> fields) {
        Map<String, Object> req = new LinkedHashMap<>();
        req.put("op", op);
        req.put("id", id);
        for (Map.Entry<String, Object> e : fields.entrySet()) {
            Object v = e.getValue();
            if (v == null || Boolean.FALSE.equals(v) || "".equals(v)
                    || (v instanceof Number && ((Number) v).longValue() == 0)
                    || (v instanceof java.util.List && ((java.util.List<?>) v).isEmpty())) {
                continue;
            }
            req.put(e.getKey(), v);
        }
        byte[] line = (Json.write(req) + "\n").getBytes(StandardCharsets.UTF_8);
        if (line.length - 1 > MAX_LINE) {
            throw new IllegalArgumentException("request of " + (line.length - 1) + " bytes exceeds the agent's " + MAX_LINE + " byte line limit");
        }
        return line;
    }

    /** A request waiting for its last event. */
    private static final class Pending {
        final String op;
        final Consumer<Event> onSynced;
        final CompletableFuture<Event> done = new CompletableFuture<>();

        Pending(String op, Consumer<Event> onSynced) {
            this.op = op;
            this.onSynced = onSynced;
        }
    }

    private CompletableFuture<Event> call(String op, Map<String, Object> fields, Consumer<Event> onSynced) {
        String id = "j" + next.incrementAndGet();
        byte[] line = encode(op, id, fields);
        Pending p = new Pending(op, onSynced);
        try {
            send(id, p, line);
        } catch (CkptException e) {
            p.done.completeExceptionally(e);
        }
        return p.done;
    }

    private static Event await(CompletableFuture<Event> f, Duration wait) throws CkptException {
        try {
            return wait == null ? f.get() : f.get(wait.toNanos(), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            f.cancel(false); // late events for it are skipped
            throw new WaitTimeoutException("the wait of " + wait + " ran out; the request goes on in the agent");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CkptException("interrupted while waiting for the agent", e);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof CkptException) {
                throw (CkptException) e.getCause();
            }
            throw new CkptException("unexpected failure: " + e.getCause(), e.getCause());
        }
    }

    /**
     * Sends a request. A connection the agent closed before this request
     * (the write fails) never read it: the request is sent again on a new
     * connection, unless the agent said it refuses this client.
     */
    private void send(String id, Pending p, byte[] line) throws CkptException {
        if (closed) {
            throw new ConnectionLostException("the client is closed", null);
        }
        Conn c = current();
        if (c.write(id, p, line)) {
            return;
        }
        AgentException refused = c.refusal();
        synchronized (dialLock) {
            if (conn == c) {
                conn = null;
            }
        }
        if (refused != null) {
            throw refused;
        }
        c = current();
        if (!c.write(id, p, line)) {
            throw new ConnectionLostException("send to the ckpt agent at " + socket + ": the connection closed", null);
        }
    }

    /** The live connection, dialled again when the last one is gone. */
    private Conn current() throws CkptException {
        synchronized (dialLock) {
            Conn c = conn;
            if (c == null || c.dead) {
                if (c != null) {
                    AgentException refused = c.refusal();
                    conn = null;
                    if (refused != null) {
                        throw refused;
                    }
                }
                c = dial();
                conn = c;
            }
            return c;
        }
    }

    private Conn dial() throws CkptException {
        long start = System.nanoTime();
        long deadline = start + dialWait.toNanos();
        long backoffMs = 10;
        UnixDomainSocketAddress addr = UnixDomainSocketAddress.of(socket);
        while (true) {
            SocketChannel ch = null;
            try {
                ch = SocketChannel.open(StandardProtocolFamily.UNIX);
                ch.connect(addr);
                return new Conn(ch);
            } catch (IOException e) {
                closeQuietly(ch);
                double waited = (System.nanoTime() - start) / 1e9;
                long leftMs = (deadline - System.nanoTime()) / 1_000_000;
                if (!notThereYet(e) || leftMs <= 0) {
                    throw new ConnectFailedException(String.format(
                            "connect to the ckpt agent at %s: %s after %.1fs (is `ckpt agent --socket %s` running, "
                                    + "and is the socket's directory shared with this app?)", socket, e.getMessage(), waited, socket), e);
                }
                try {
                    Thread.sleep(Math.min(backoffMs, leftMs));
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new ConnectFailedException("interrupted while connecting to the ckpt agent at " + socket, ie);
                }
                backoffMs = Math.min(2 * backoffMs, 1000);
            }
        }
    }

    /** Whether a failed dial means the agent is not there yet: no socket, or nobody listening on it. */
    private boolean notThereYet(IOException e) {
        String m = String.valueOf(e.getMessage());
        return !Files.exists(socket) || m.contains("refused") || m.contains("No such file");
    }

    private static void closeQuietly(SocketChannel ch) {
        if (ch != null) {
            try {
                ch.close();
            } catch (IOException ignored) {
                // nothing to do
            }
        }
    }

    /** One connection and its reader thread. */
    private final class Conn {
        final SocketChannel ch;
        final Map<String, Pending> pending = new ConcurrentHashMap<>();
        final Object writeLock = new Object();
        final Thread reader;
        volatile boolean dead;
        volatile AgentException refused;

        Conn(SocketChannel ch) {
            this.ch = ch;
            this.reader = new Thread(this::read, "ckpt-client-reader");
            this.reader.setDaemon(true);
            this.reader.start();
        }

        /** Registers p and writes its line; false when the connection is closed. */
        boolean write(String id, Pending p, byte[] line) {
            pending.put(id, p);
            p.done.whenComplete((v, t) -> pending.remove(id, p)); // answered, failed or given up
            synchronized (writeLock) {
                try {
                    if (dead) {
                        throw new IOException("closed");
                    }
                    ByteBuffer b = ByteBuffer.wrap(line);
                    while (b.hasRemaining()) {
                        ch.write(b);
                    }
                    return true;
                } catch (IOException e) {
                    pending.remove(id);
                    return false;
                }
            }
        }

        /** The agent's refusal, once the reader has read all it sent. */
        AgentException refusal() {
            try {
                reader.join(2000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return refused;
        }

        void shut() {
            dead = true;
            closeQuietly(ch);
        }

        private void read() {
            ByteBuffer buf = ByteBuffer.allocate(64 << 10);
            java.io.ByteArrayOutputStream line = new java.io.ByteArrayOutputStream();
            Exception cause = null;
            try {
                while (true) {
                    buf.clear();
                    int n = ch.read(buf);
                    if (n < 0) {
                        break;
                    }
                    byte[] a = buf.array();
                    int from = 0;
                    for (int k = 0; k < n; k++) {
                        if (a[k] == '\n') {
                            line.write(a, from, k - from);
                            dispatch(line.toString(StandardCharsets.UTF_8));
                            line.reset();
                            from = k + 1;
                        }
                    }
                    line.write(a, from, n - from);
                }
            } catch (IOException e) {
                cause = e;
            } finally {
                dead = true;
                closeQuietly(ch);
                AgentException r = refused;
                for (Map.Entry<String, Pending> e : pending.entrySet()) {
                    CkptException err = r != null ? r : new ConnectionLostException(closed
                            ? "the client was closed"
                            : "the ckpt agent at " + socket + " closed the connection before answering "
                            + "(it stopped or restarted); ask status for the request's outcome", cause);
                    e.getValue().done.completeExceptionally(err);
                }
                pending.clear();
            }
        }

        private void dispatch(String text) {
            Event ev = Event.parse(text);
            if (ev == null) {
                return;
            }
            if ("error".equals(ev.name()) && ev.id() == null) {
                refused = AgentException.of(ev); // the agent refuses this connection and closes it
                return;
            }
            for (Map.Entry<String, Pending> e : pending.entrySet()) {
                if (!answers(ev, e.getKey())) {
                    continue;
                }
                Pending p = e.getValue();
                if (!isFinal(p.op, ev)) {
                    if (p.onSynced != null) {
                        p.onSynced.accept(ev);
                    }
                    return;
                }
                pending.remove(e.getKey());
                CkptException err = failure(p.op, ev);
                if (err != null) {
                    p.done.completeExceptionally(err);
                } else {
                    p.done.complete(ev);
                }
                return;
            }
            // An event for a request nobody waits for any more: skipped.
        }
    }
}
