// Beam's Flink job server (FlinkJobServerDriver, unchanged) with a job invoker that stages no jars.
//
// Beam's FlinkJobInvoker hands Flink every jar on the job server's own classpath with each job
// (PipelineResources.detectClassPathResourcesToStage): 174 jars, 173 MB for Beam 2.62's runner, uploaded
// to the JobManager's blob server and downloaded by each TaskManager that runs a task, which then loads
// Beam's classes afresh in a new class loader (and compiles them again). On the 2-core machine the
// upload alone took 16-19 s of every job (docs/benchmarks.md). `streameval cluster up flink
// --runner-on-classpath` puts Beam's runner on the Flink processes' own classpath instead
// (streameval/commands/cluster.py), so a job needs no jars: this invoker is
// FlinkJobInvoker.invokeWithExecutor with an empty list of files to stage.
//
// Compiled by `streameval cluster fetch` (streameval/commands/engines.py, job_server_launcher) against the
// cached runner classpath; public API of Beam's runner only.
package streameval.flink;

import java.util.Collections;
import java.util.UUID;
import org.apache.beam.model.pipeline.v1.RunnerApi;
import org.apache.beam.runners.flink.FlinkJobInvoker;
import org.apache.beam.runners.flink.FlinkJobServerDriver;
import org.apache.beam.runners.flink.FlinkPipelineOptions;
import org.apache.beam.runners.flink.FlinkPipelineRunner;
import org.apache.beam.runners.jobsubmission.JobInvocation;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.vendor.grpc.v1p60p1.com.google.protobuf.Struct;
import org.apache.beam.vendor.guava.v32_1_2_jre.com.google.common.util.concurrent.ListeningExecutorService;

public final class StreamevalFlinkJobServer {
  private StreamevalFlinkJobServer() {}

  /** The job server's own options (FlinkJobServerDriver's), e.g. --flink-master and --flink-conf-dir. */
  public static void main(String[] args) throws Exception {
    FlinkJobServerDriver.FlinkServerConfiguration config = FlinkJobServerDriver.parseArgs(args);
    String master = option(args, "--flink-master");
    String confDir = option(args, "--flink-conf-dir");
    FlinkJobServerDriver.fromConfig(config, () -> new Invoker(config, master, confDir)).run();
  }

  private static String option(String[] args, String name) {
    for (int i = 0; i < args.length; i++) {
      if (args[i].equals(name) && i + 1 < args.length) {
        return args[i + 1];
      }
      if (args[i].startsWith(name + "=")) {
        return args[i].substring(name.length() + 1);
      }
    }
    return null;
  }

  static final class Invoker extends FlinkJobInvoker {
    private final String master;
    private final String confDir;

    Invoker(FlinkJobServerDriver.FlinkServerConfiguration config, String master, String confDir) {
      super(config);
      this.master = master;
      this.confDir = confDir;
    }

    @Override
    protected JobInvocation invokeWithExecutor(
        RunnerApi.Pipeline pipeline,
        Struct options,
        String retrievalToken,
        ListeningExecutorService executorService) {
      FlinkPipelineOptions flink =
          PipelineOptionsTranslation.fromProto(options).as(FlinkPipelineOptions.class);
      String invocationId = String.format("%s_%s", flink.getJobName(), UUID.randomUUID());
      if (master != null && FlinkPipelineOptions.AUTO.equals(flink.getFlinkMaster())) {
        flink.setFlinkMaster(master);
      }
      FlinkPipelineRunner runner = new FlinkPipelineRunner(flink, confDir, Collections.emptyList());
      flink.setRunner(null);
      return createJobInvocation(invocationId, retrievalToken, executorService, pipeline, flink, runner);
    }
  }
}
