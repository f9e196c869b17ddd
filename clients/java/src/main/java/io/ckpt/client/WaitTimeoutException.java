package io.ckpt.client;

/** WaitTimeoutException: the caller's wait ran out; the request goes on in the agent. */
public class WaitTimeoutException extends CkptException {
    private static final long serialVersionUID = 1L;

    public WaitTimeoutException(String message) {
        super(message);
    }
}
