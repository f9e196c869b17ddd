package io.ckpt.client;

/**
 * ConnectionLostException: the connection closed before the request's
 * last event, so its outcome is unknown (ask status). The next call dials
 * the agent again.
 */
public class ConnectionLostException extends CkptException {
    private static final long serialVersionUID = 1L;

    public ConnectionLostException(String message, Throwable cause) {
        super(message, cause);
    }
}
