package io.ckpt.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.function.Consumer;

/**
 * CheckpointOptions are a checkpoint's optional arguments, set in chain:
 * {@code new CheckpointOptions().engine("rocksdb").timeout(Duration.ofMinutes(10))}.
 */
public final class CheckpointOptions {
    String engine;
    boolean handoff;
    Duration timeout;
    List<String> tasks;
    String job;
    String traceparent;
    Consumer<Event> onSynced;
    Duration waitFor;
    Path walDir;

    /** The store's engine ("pebble", "rocksdb"), when known. */
    public CheckpointOptions engine(String engine) {
        this.engine = engine;
        return this;
    }

    /** Gives dir to the agent: it may move it; do not use it afterwards. */
    public CheckpointOptions handoff(boolean handoff) {
        this.handoff = handoff;
        return this;
    }

    /** Bounds the upload (the agent fails it with unavailable past it). */
    public CheckpointOptions timeout(Duration timeout) {
        this.timeout = timeout;
        return this;
    }

    /** Makes the checkpoint job-wide: every task of the job at this number. */
    public CheckpointOptions tasks(List<String> tasks) {
        this.tasks = List.copyOf(tasks);
        return this;
    }

    /** The job the request is for (node-agent mode). */
    public CheckpointOptions job(String job) {
        this.job = job;
        return this;
    }

    /** The app's W3C trace context. */
    public CheckpointOptions traceparent(String traceparent) {
        this.traceparent = traceparent;
        return this;
    }

    /** Called with the synced event: from then on the app may delete dir. */
    public CheckpointOptions onSynced(Consumer<Event> onSynced) {
        this.onSynced = onSynced;
        return this;
    }

    /**
     * The live store's directory (absolute): the agent ships the store's
     * write-ahead log between this checkpoint and the next.
     */
    public CheckpointOptions walDir(Path walDir) {
        this.walDir = walDir;
        return this;
    }

    /** Bounds how long the call blocks (WaitTimeoutException; the checkpoint goes on). */
    public CheckpointOptions waitFor(Duration waitFor) {
        this.waitFor = waitFor;
        return this;
    }
}
